"""The arguments both SDK local-mode programs take (sdk_v2_local.py, sdk_v3_local.py)."""

import argparse


def parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--image", required=True)
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--processes-per-host", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--data", required=True, help="a directory with training/ and validation/ channels")
    parser.add_argument("--work", required=True, help="the SDK's local container root (and v2's output_path)")
    parser.add_argument("--source-dir", help="script mode: the user's code, with train.py")
    return parser
