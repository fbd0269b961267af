"""The request shapes of the input estimate: the corpus is ``tests/input_shapes.py`` (tests
import nothing from bench/); the benchmarks take it from there."""

from tests.input_shapes import SHAPES, jpeg_header, mp3, png, shape, wav

__all__ = ["SHAPES", "jpeg_header", "mp3", "png", "shape", "wav"]
