"""A way of training added from outside the image's code: a launcher and a trainer registered as
entry points (dtc.launchers, dtc.trainers) by this directory's distribution, for
tests/integration/test_new_way_of_training.py and docs/development.md."""
