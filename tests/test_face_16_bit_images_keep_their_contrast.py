"""A 16-bit grayscale PNG (medical, scientific and some camera exports) decodes as its top 8
bits: Pillow's RGB conversion clipped every value above 255, and such an image came out
near-white, to be trained on or embedded without a word."""
import numpy as np
from PIL import Image

from embcache.face.data.images import decode_image


def gradient(tmp_path, mode_16: bool):
    values = (np.arange(48 * 48).reshape(48, 48) * 28).astype(np.uint16)  # 0 .. 64,484
    path = tmp_path / ("g16.png" if mode_16 else "g8.png")
    Image.fromarray(values if mode_16 else (values >> 8).astype(np.uint8)).save(path)
    return path


def test_a_16_bit_image_decodes_as_its_8_bit_version(tmp_path):
    sixteen, eight = gradient(tmp_path, True), gradient(tmp_path, False)
    assert Image.open(sixteen).mode.startswith("I")  # what Pillow opens a 16-bit PNG as
    decoded = decode_image(sixteen, "g16.png", size=48)
    assert decoded.equal(decode_image(eight, "g8.png", size=48))
    assert decoded.min() < -0.9 and decoded.max() > 0.9  # the whole range, not near-white


def test_an_i_image_of_8_bit_values_is_taken_as_it_is(tmp_path):
    values = (np.arange(48 * 48).reshape(48, 48) % 256).astype(np.int32)
    Image.fromarray(values, "I").save(tmp_path / "i.tif")
    Image.fromarray(values.astype(np.uint8)).save(tmp_path / "l.png")
    assert decode_image(tmp_path / "i.tif", "i.tif", size=48).equal(decode_image(tmp_path / "l.png", "l.png", size=48))
