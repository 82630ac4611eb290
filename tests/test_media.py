"""runtime/media.py against transformers 5.24 on the same inputs: Gemma 4's image processor (the Pillow one, which
transformers picks without torchvision) and audio feature extractor, images and clips made here; and the hostile
inputs, each refused in one line."""

from __future__ import annotations

import io
import struct
import types
import zlib

import numpy as np
import pytest
from PIL import Image
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor, get_aspect_ratio_preserving_size

from mtpkit.errors import UsageError
from mtpkit.runtime import media

# mel features are compared to this absolute tolerance (log-mel values are O(1) to O(10))
MEL_ATOL = 1e-5


@pytest.fixture(scope="module")
def hf_image():
    return Gemma4ImageProcessorPil()


@pytest.fixture(scope="module")
def hf_audio():
    return Gemma4AudioFeatureExtractor()


def picture(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """uint8 [height, width, channels]: gradients (what resizing smooths) plus noise (what it must not lose)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), (x + y) % 256], axis=-1)
    base = np.concatenate([base] * (channels // 3 + 1), axis=-1)[..., :channels]
    return np.clip(base + rng.integers(-40, 41, base.shape), 0, 255).astype(np.uint8)


def assert_same_image(ours, hf_image, hf_input, budget=280):
    patches, positions, tokens = ours
    ref = hf_image(hf_input, max_soft_tokens=budget, return_tensors="np")
    assert patches.dtype == np.float32 and positions.dtype == np.int32
    assert patches.shape == ref["pixel_values"][0].shape == (budget * 9, 768)
    np.testing.assert_array_equal(patches, ref["pixel_values"][0])
    np.testing.assert_array_equal(positions, ref["image_position_ids"][0])
    assert tokens == int(ref["num_soft_tokens_per_image"][0])
    real = (positions[:, 0] >= 0).sum()
    assert real == tokens * 9 and (positions[real:] == -1).all() and not patches[real:].any()
    return tokens


# (height, width): landscape, portrait, one already at its target size (no resize), small (upscaled), odd,
# very wide and very tall (a side rounds to 0 and becomes one 48-pixel row), 1 x 10000 both ways, 1 x 1
SIZES = [(480, 640), (640, 480), (768, 768), (37, 53), (333, 517), (20, 3000), (3000, 20), (1, 10000),
         (10000, 1), (1, 1)]


@pytest.mark.parametrize("height,width", SIZES)
def test_pil_images_match_transformers(hf_image, height, width):
    image = Image.fromarray(picture(height, width, seed=height + width))
    tokens = assert_same_image(media.image_patches(image), hf_image, image)
    assert tokens == media.image_soft_tokens(height, width)
    if (height, width) in ((1, 10000), (10000, 1)):
        assert tokens == 280  # transformers upsamples one pixel to a 48-pixel row: 48 x 13440


@pytest.mark.parametrize("budget", media.BUDGETS)
def test_every_budget_matches_transformers(hf_image, budget):
    image = Image.fromarray(picture(480, 640))
    tokens = assert_same_image(media.image_patches(image, budget), hf_image, image, budget)
    assert tokens <= budget and tokens == media.image_soft_tokens(480, 640, budget)


def test_resized_size_matches_transformers_over_many_shapes():
    sides = [1, 2, 3, 7, 16, 47, 48, 49, 100, 223, 480, 512, 640, 768, 803, 1000, 1080, 1920, 4032, 10000, 65535]
    for budget in media.BUDGETS:
        for h in sides:
            for w in sides:
                want = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
                assert media.resized_size(h, w, budget) == want, (h, w, budget)


def rgba_picture(height: int, width: int) -> np.ndarray:
    rgba = picture(height, width, channels=4, seed=7)
    rgba[..., 3] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]  # transparent to opaque, left to right
    return rgba


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16", "CMYK"])
def test_pil_modes_match_transformers(hf_image, mode):
    rgb = Image.fromarray(picture(90, 160, seed=3))
    image = {"L": lambda: rgb.convert("L"), "LA": lambda: Image.fromarray(rgba_picture(90, 160)).convert("LA"),
             "RGBA": lambda: Image.fromarray(rgba_picture(90, 160)),
             "P": lambda: rgb.quantize(16), "I;16": lambda: rgb.convert("L").convert("I;16"),
             "CMYK": lambda: rgb.convert("CMYK")}[mode]()
    assert image.mode == mode
    assert_same_image(media.image_patches(image), hf_image, image)


@pytest.mark.parametrize("kind", [Image.fromarray, np.asarray])
def test_alpha_is_composited_onto_white(hf_image, kind):
    clear = kind(np.zeros((96, 96, 4), np.uint8))  # black, fully transparent
    ours = media.image_patches(clear)
    tokens = assert_same_image(ours, hf_image, clear)
    assert (ours[0][:tokens * 9] == 1.0).all()  # white, not black


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_arrays_match_transformers(hf_image, channels):
    array = rgba_picture(150, 250) if channels == 4 else picture(150, 250, channels, seed=channels)
    assert_same_image(media.image_patches(array), hf_image, array)


def test_a_two_dimensional_array_is_grayscale(hf_image):
    gray = picture(150, 250, 1, seed=5)
    assert_same_image(media.image_patches(gray[..., 0]), hf_image, gray)  # transformers takes it as (H, W, 1)


def png_bytes(image: Image.Image, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=params.pop("format", "PNG"), **params)
    return buffer.getvalue()


def test_files_match_transformers_paths(hf_image, tmp_path):
    """A file goes through transformers' load_image: EXIF orientation applied, alpha dropped (not composited), and a
    palette's transparent colour composited onto white after all."""
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise
    palette = Image.fromarray(picture(60, 90, seed=9)).quantize(8)
    files = {
        "photo.jpg": png_bytes(Image.fromarray(picture(300, 400, seed=1)), format="JPEG", quality=90, exif=exif),
        "alpha.png": png_bytes(Image.fromarray(rgba_picture(90, 160))),
        "palette.png": png_bytes(palette, transparency=3),
        "gray.png": png_bytes(Image.fromarray(picture(70, 50, 1, seed=2)[..., 0])),
    }
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        from_path = media.image_patches(path)
        assert_same_image(from_path, hf_image, str(path))
        for ours, ref in zip(media.image_patches(data), from_path):  # bytes are decoded like the file
            np.testing.assert_array_equal(ours, ref)
    rotated = media.image_rgb(tmp_path / "photo.jpg")
    assert rotated.shape == (400, 300, 3)  # upright: the EXIF rotation was applied
    assert not np.array_equal(media.image_rgb(tmp_path / "alpha.png"),
                              media.image_rgb(Image.open(tmp_path / "alpha.png")))  # file: dropped; PIL: onto white


# ---- audio -----------------------------------------------------------------------------------------------------

def sweep(seconds: float, dtype=np.float32) -> np.ndarray:
    """A sine sweep from 50 Hz to 7.5 kHz at amplitude 0.5, plus a little noise."""
    t = np.arange(int(seconds * 16000)) / 16000
    phase = 2 * np.pi * (50 * t + (7500 - 50) / (2 * seconds) * t**2)
    noise = np.random.default_rng(0).normal(0, 0.01, t.size)
    return (0.5 * np.sin(phase) + noise).astype(dtype)


def assert_same_audio(samples, hf_audio):
    mel, mask = media.audio_features(samples, 16000)
    ref = hf_audio([samples], return_tensors="np")  # a batch of one: transformers 5.24 fails on a bare 1-D array
    ref_mel, ref_mask = ref["input_features"][0], ref["input_features_mask"][0]
    assert mel.dtype == np.float32 and mask.dtype == bool
    assert mel.shape == ref_mel.shape and mel.shape[1:] == (128,)
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_allclose(mel, ref_mel, rtol=0, atol=MEL_ATOL)
    return mel, mask


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sweep_matches_transformers(hf_audio, dtype):
    mel, mask = assert_same_audio(sweep(3.0, dtype), hf_audio)
    assert mel.shape == (299, 128) and mask.all()  # 48000 samples: (48000 + 160 - 321) // 160 + 1
    loudest = mel[:, :].argmax(axis=1)
    assert loudest[250] > loudest[50] + 40  # the sweep climbs the mel bins: the features are not flat


def test_a_clip_longer_than_30_seconds_is_cut_as_transformers_cuts_it(hf_audio):
    mel, mask = assert_same_audio(sweep(31.0), hf_audio)
    assert mel.shape == (2999, 128) and mask.all()
    assert media.audio_soft_tokens(mask) == 750
    np.testing.assert_array_equal(media.audio_features(sweep(31.0)[:480_000], 16000)[0], mel)


# 100: no frame at all; 129-160: one frame, not valid; 161: the first valid frame; then whole and ragged lengths
@pytest.mark.parametrize("length", [100, 129, 160, 161, 16000, 16001, 12345])
def test_short_and_ragged_clips_match_transformers(hf_audio, length):
    mel, mask = assert_same_audio(sweep(1.0)[:length] if length <= 16000 else sweep(2.0)[:length], hf_audio)
    frames = max(((length + 127) // 128 * 128 - 161) // 160 + 1, 0)  # padded to 128, 160 in front, 321 per frame
    assert mel.shape[0] == frames and mask.sum() == max((length - 161) // 160 + 1, 0)
    assert not mel[~mask].any()


@pytest.mark.parametrize("length", [161, 1000, 16000, 16001, 40000, 480000])
def test_audio_soft_tokens_match_the_processor(length):
    _, mask = media.audio_features(np.full(length, 0.1, np.float32), 16000)
    stand_in = types.SimpleNamespace(boa_token="<boa>", eoa_token="<eoa>", audio_token="<a>", audio_seq_length=750,
                                     feature_extractor=Gemma4AudioFeatureExtractor())
    text = Gemma4Processor.replace_audio_token(stand_in, {"input_features_mask": [mask]}, 0)
    assert media.audio_soft_tokens(mask) == text.count("<a>") > 0
    # the count transformers gives from the length alone agrees
    assert media.audio_soft_tokens(mask) == Gemma4Processor._compute_audio_num_tokens(stand_in, np.zeros(length), 16000)
    if length == 480000:
        assert media.audio_soft_tokens(mask) == 750


def test_the_mel_filters_and_window_are_transformers(hf_audio):
    np.testing.assert_array_equal(media._mel_filters(), hf_audio.mel_filters)
    np.testing.assert_array_equal(media._window(), hf_audio.window)
    assert (hf_audio.frame_length, hf_audio.hop_length, hf_audio.fft_length) == (media.FRAME, media.HOP, media.FFT)


# ---- hostile inputs: each refused with one line naming the input ------------------------------------------------

def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message
    return message


def bomb_png() -> bytes:
    """A PNG header claiming 20000 x 20000 pixels: past Pillow's decompression-bomb limit."""
    head = png_bytes(Image.new("RGB", (1, 1)))
    ihdr = head.index(b"IHDR")
    body = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + body
    return head[:ihdr - 4] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + head[ihdr + 21:]


def test_hostile_images_are_refused_in_one_line(tmp_path):
    good = png_bytes(Image.fromarray(picture(64, 64)))
    (tmp_path / "garbage.png").write_bytes(np.random.default_rng(0).bytes(2000))
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "truncated.png").write_bytes(good[: len(good) // 2])
    cases = {
        tmp_path / "garbage.png": "is not an image Pillow can read",
        tmp_path / "empty.png": "is not an image Pillow can read",
        tmp_path / "truncated.png": "cannot be decoded",
        tmp_path / "missing.png": "does not exist",
        tmp_path: "is not a file",
    }
    for path, text in cases.items():
        message = refusal(media.image_patches, path)
        assert text in message and str(path) in message and "give an image file" in message
    assert "image bytes (0 bytes) is not an image" in refusal(media.image_patches, b"")
    assert "exceeds limit" in refusal(media.image_patches, bomb_png())
    assert "has no pixels (0 x 5)" in refusal(media.image_patches, Image.new("RGB", (0, 5)))
    assert "has no pixels" in refusal(media.image_patches, np.zeros((0, 8, 3), np.uint8))
    assert "dtype float64" in refusal(media.image_patches, np.random.default_rng(0).random((32, 32, 3)))
    assert "shape (3, 32, 32, 3)" in refusal(media.image_patches, np.zeros((3, 32, 32, 3), np.uint8))
    assert "shape (32, 32, 2)" in refusal(media.image_patches, np.zeros((32, 32, 2), np.uint8))
    assert "type list" in refusal(media.image_patches, [[0, 0], [0, 0]])
    for budget in (300, 0, True, "280", 280.0):
        assert "70, 140, 280, 560, 1120" in refusal(media.image_patches, good, budget)


def test_hostile_audio_is_refused_in_one_line():
    clip = sweep(1.0)
    assert "44100 Hz" in (m := refusal(media.audio_features, clip, 44100)) and "16000 Hz" in m
    assert "must be an integer" in refusal(media.audio_features, clip, 16000.0)
    for stereo in (np.stack([clip, clip]), np.stack([clip, clip], axis=1)):
        assert "has 2 channels" in refusal(media.audio_features, stereo, 16000)
    assert "has several channels" in refusal(media.audio_features, clip.reshape(2, 2, -1), 16000)
    assert "has no samples" in refusal(media.audio_features, np.zeros(0, np.float32), 16000)
    assert "has no samples" in refusal(media.audio_features, [], 16000)
    assert "dtype int16" in refusal(media.audio_features, (clip * 32767).astype(np.int16), 16000)
    assert "NaN or infinite" in refusal(media.audio_features, np.r_[clip, np.nan], 16000)
    mono = media.audio_features(clip[None, :], 16000)[0]  # one channel, either axis, is mono
    np.testing.assert_array_equal(mono, media.audio_features(clip[:, None], 16000)[0])
