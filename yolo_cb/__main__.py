"""`python -m yolo_cb ...` (and `torchrun -m yolo_cb train ...`) runs the CLI."""

from yolo_cb.cli import entrypoint

if __name__ == "__main__":
    entrypoint()
