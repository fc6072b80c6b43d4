"""The samples of an ImageFolder channel: image files directly inside class folders.

A channel copied from S3 often holds more than images: a ``_SUCCESS`` marker or a manifest at
its top, ``.DS_Store`` or a ``README`` in a class folder, a hidden ``.ipynb_checkpoints``
folder. Counted as images they skew the step count and the "exact" validation count, and a
decoder crashes on them. Here a class is a non-hidden folder at the channel's top (labels follow
the sorted folder names, as DALI's ``fn.readers.file`` and torchvision's ``ImageFolder`` do); a
sample is a file in it whose extension is one DALI's image decoder reads; everything else is
listed in ``ignored`` for one log line and never read.
"""

import logging
import os
from dataclasses import dataclass

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2",
                              ".pnm", ".pgm", ".ppm", ".pbm"})
IGNORED_SHOWN = 10


@dataclass(frozen=True)
class Channel:
    """One channel's listing.

    Attributes:
        root: the channel directory.
        classes: class folder names, sorted; a sample's label is its folder's index here.
        files: sample paths relative to ``root`` (``<class>/<file>``), sorted by class then name.
        labels: int label per file, same length as ``files``.
        ignored: paths relative to ``root`` of everything that is not a sample.
    """

    root: str
    classes: tuple[str, ...]
    files: tuple[str, ...]
    labels: tuple[int, ...]
    ignored: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.files)

    def log_ignored(self, log: logging.Logger) -> None:
        """One warning line naming what was skipped (the first ``IGNORED_SHOWN`` paths)."""
        if self.ignored:
            shown = ", ".join(self.ignored[:IGNORED_SHOWN]) + (" ..." if len(self.ignored) > IGNORED_SHOWN else "")
            log.warning("channel %s: ignoring %d entries that are not image files in class folders: %s",
                        self.root, len(self.ignored), shown)


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS and not name.startswith(".")


def list_images(root: str) -> Channel:
    """Lists the channel at ``root``.

    Raises:
        FileNotFoundError: ``root`` does not exist, or holds no image file in a class folder
            (the message names the directory and what was found instead).
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"channel directory {root} does not exist: give the job this channel "
                                "(an ImageFolder tree: <channel>/<class>/<image>)")
    classes, ignored = [], []
    for entry in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, entry)) and not entry.startswith("."):
            classes.append(entry)
        else:
            ignored.append(entry + ("/" if os.path.isdir(os.path.join(root, entry)) else ""))
    files, labels = [], []
    for label, name in enumerate(classes):
        for entry in sorted(os.listdir(os.path.join(root, name))):
            path = os.path.join(name, entry)
            if _is_image(entry) and os.path.isfile(os.path.join(root, path)):
                files.append(path)
                labels.append(label)
            else:
                ignored.append(path + ("/" if os.path.isdir(os.path.join(root, path)) else ""))
    if not files:
        raise FileNotFoundError(
            f"channel {root} has no image files in class folders (<class>/<name>.jpg|png|...); "
            f"found: {', '.join(ignored[:IGNORED_SHOWN]) or 'nothing'}")
    return Channel(root, tuple(classes), tuple(files), tuple(labels), tuple(ignored))
