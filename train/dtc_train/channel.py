"""The samples of an ImageFolder channel: image files directly inside class folders.

A channel copied from S3 often holds more than images: a ``_SUCCESS`` marker or a manifest at
its top, ``.DS_Store`` or a ``README`` in a class folder, a hidden ``.ipynb_checkpoints``
folder. Counted as images they skew the step count and the "exact" validation count, and a
decoder crashes on them. Here a class is a non-hidden folder at the channel's top (labels follow
the sorted folder names, as DALI's ``fn.readers.file`` and torchvision's ``ImageFolder`` do); a
sample is a file in it whose extension is one DALI's image decoder reads; everything else is
listed in ``ignored`` for one log line and never read.

Corrupt images (a truncated upload, an HTML error page saved as ``.jpg``) would stop DALI or
Pillow mid-epoch. ``corrupt_images`` (the trainers' ``corrupt-images`` hyperparameter) decides:
``fail`` (the default) checks every sample's header with Pillow (``Image.verify``: one read of
the file's start, no decode) and refuses the channel naming the bad files; ``skip`` checks the
same way, leaves them out and names them once in the log; ``off`` checks nothing (for channels
of millions of files already known to be clean).
"""

import logging
import os
from collections import Counter
from dataclasses import dataclass

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2",
                              ".pnm", ".pgm", ".ppm", ".pbm"})
IGNORED_SHOWN = 10
CORRUPT_IMAGES_CHOICES = ("fail", "skip", "off")


@dataclass(frozen=True)
class Channel:
    """One channel's listing.

    Attributes:
        root: the channel directory.
        classes: class folder names, sorted; a sample's label is its folder's index here.
        files: sample paths relative to ``root`` (``<class>/<file>``), sorted by class then name.
        labels: int label per file, same length as ``files``.
        ignored: paths relative to ``root`` of everything that is not a sample.
        corrupt: paths relative to ``root`` of image files whose header Pillow cannot read,
            left out of ``files`` (``corrupt_images="skip"``).
    """

    root: str
    classes: tuple[str, ...]
    files: tuple[str, ...]
    labels: tuple[int, ...]
    ignored: tuple[str, ...]
    corrupt: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.files)

    def with_classes(self, classes: tuple[str, ...]) -> "Channel":
        """This listing labelled by ``classes`` (sorted, a superset of ``self.classes``): the
        union of every host's class folders when each host holds a part of the channel, one of
        which may lack a class.

        Raises:
            ValueError: ``classes`` lacks one of this listing's classes.
        """
        missing = sorted(set(self.classes) - set(classes))
        if missing:
            raise ValueError(f"channel {self.root}: class folders {missing} are not among {list(classes)}")
        index = {name: label for label, name in enumerate(classes)}
        labels = tuple(index[self.classes[label]] for label in self.labels)
        return Channel(self.root, tuple(classes), self.files, labels, self.ignored, self.corrupt)

    @staticmethod
    def merged(parts: list["Channel"]) -> "Channel":
        """One listing of every host's part of a ``ShardedByS3Key`` channel (``root``: the first
        part's): the classes are the union of the parts', every file relabelled by them
        (``with_classes``) and sorted by class then name as ``list_images`` sorts one tree, so
        the parts of a channel list as the whole channel does FullyReplicated.

        Raises:
            ValueError: a path listed in two parts (S3 keys are unique, so the parts are not one
                channel's).
        """
        classes = tuple(sorted({name for part in parts for name in part.classes}))
        samples = sorted((label, path) for part in parts
                         for path, label in zip(part.files, part.with_classes(classes).labels, strict=True))
        paths = [path for _, path in samples]
        repeated = sorted(path for path, count in Counter(paths).items() if count > 1)
        if repeated:
            raise ValueError(f"channel {parts[0].root}: {', '.join(repeated[:IGNORED_SHOWN])} listed on two hosts")
        return Channel(parts[0].root, classes, tuple(paths), tuple(label for label, _ in samples),
                       tuple(path for part in parts for path in part.ignored),
                       tuple(path for part in parts for path in part.corrupt))

    def log_ignored(self, log: logging.Logger) -> None:
        """One warning line naming what was skipped (the first ``IGNORED_SHOWN`` paths)."""
        if self.ignored:
            shown = ", ".join(self.ignored[:IGNORED_SHOWN]) + (" ..." if len(self.ignored) > IGNORED_SHOWN else "")
            log.warning("channel %s: ignoring %d entries that are not image files in class folders: %s",
                        self.root, len(self.ignored), shown)
        if self.corrupt:
            shown = ", ".join(self.corrupt[:IGNORED_SHOWN]) + (" ..." if len(self.corrupt) > IGNORED_SHOWN else "")
            log.warning("channel %s: skipping %d corrupt image files (corrupt-images=skip): %s",
                        self.root, len(self.corrupt), shown)


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS and not name.startswith(".")


def _is_readable_image(source) -> bool:
    from PIL import Image, UnidentifiedImageError  # noqa: PLC0415  (Pillow only to check headers; `train` lists channels)

    try:
        with Image.open(source) as image:
            image.verify()
        return True
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
        return False


def list_images(root: str, corrupt_images: str = "fail", allow_empty: bool = False) -> Channel:
    """Lists the channel at ``root``; ``corrupt_images``: ``fail``, ``skip`` or ``off`` (above);
    ``allow_empty``: return a listing without files instead of raising (a host's part of a
    ``ShardedByS3Key`` channel, which every rank checks together: ``dali_data.rank_data``).

    Raises:
        FileNotFoundError: ``root`` does not exist, or holds no image file in a class folder
            and ``allow_empty`` is False (the message names the directory and what was found
            instead).
        ValueError: corrupt image files with ``corrupt_images="fail"`` (named, with the option
            that skips them), or an unknown ``corrupt_images``.
    """
    if corrupt_images not in CORRUPT_IMAGES_CHOICES:
        raise ValueError(f"corrupt-images must be one of {', '.join(CORRUPT_IMAGES_CHOICES)}, got {corrupt_images!r}")
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
    listing = without_corrupt(Channel(root, tuple(classes), tuple(files), tuple(labels), tuple(ignored)),
                              corrupt_images, lambda path: os.path.join(root, path))
    if not listing.files and not allow_empty:
        raise FileNotFoundError(
            f"channel {root} has no image files in class folders (<class>/<name>.jpg|png|...); "
            f"found: {', '.join(ignored[:IGNORED_SHOWN]) or 'nothing'}")
    return listing


def listing_of_paths(root: str, top: list[str], inside: list[str], deeper: list[str]) -> Channel:
    """The listing ``list_images`` would make (before its corrupt-image check) of a channel
    seen only as paths, e.g. another host's part listed with ``tf.io.matching_files``: ``top``
    the names at the channel's top, ``inside`` the ``<folder>/<name>`` paths one level down,
    ``deeper`` the paths one level further (which tell the folders among ``inside``). A folder
    is a name with something in it (S3 holds no empty folder): a class is a non-hidden top
    folder, a sample an entry of a class that is no folder and whose name ``list_images``
    takes for an image file.
    """
    folders = {path.split("/", 1)[0] for path in inside}
    inner_folders = {path.rsplit("/", 1)[0] for path in deeper}
    classes = sorted(name for name in folders if not name.startswith("."))
    index = {name: label for label, name in enumerate(classes)}
    ignored = [name + ("/" if name in folders else "") for name in sorted(top) if name not in index]
    files, labels = [], []
    for path in sorted(inside, key=lambda path: (index.get(path.split("/", 1)[0], -1), path)):
        folder, name = path.split("/", 1)
        if folder not in index:
            continue
        if _is_image(name) and path not in inner_folders:
            files.append(path)
            labels.append(index[folder])
        else:
            ignored.append(path + ("/" if path in inner_folders else ""))
    return Channel(root, tuple(classes), tuple(files), tuple(labels), tuple(ignored))


def without_corrupt(listing: Channel, corrupt_images: str, source) -> Channel:
    """``listing`` less the files whose header Pillow cannot read (``corrupt_images``: above);
    ``source(path)``: what ``PIL.Image.open`` reads for a listed path (a file name or a file
    object).

    Raises:
        ValueError: corrupt image files with ``corrupt_images="fail"``, named with the option
            that skips them.
    """
    if corrupt_images == "off":
        return listing
    corrupt = [path for path in listing.files if not _is_readable_image(source(path))]
    if corrupt and corrupt_images == "fail":
        shown = ", ".join(corrupt[:IGNORED_SHOWN]) + (" ..." if len(corrupt) > IGNORED_SHOWN else "")
        raise ValueError(f"channel {listing.root} has {len(corrupt)} corrupt image files (Pillow cannot read them): "
                         f"{shown}; remove them, or set the hyperparameter corrupt-images=skip to train "
                         "without them")
    bad = set(corrupt)
    kept = [(path, label) for path, label in zip(listing.files, listing.labels, strict=True) if path not in bad]
    return Channel(listing.root, listing.classes, tuple(path for path, _ in kept), tuple(label for _, label in kept),
                   listing.ignored, tuple(corrupt))
