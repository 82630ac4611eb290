"""Image and audio preprocessing for Gemma 4's vision and audio encoders, in numpy and Pillow (no torch).

`image_patches` computes what transformers 5.24's Gemma 4 image processor (`Gemma4ImageProcessorPil`, the one it
uses without torchvision) returns for one image, and `audio_features` what its `Gemma4AudioFeatureExtractor` returns
for a batch of one clip, at the settings Gemma 4 checkpoints ship (patch 16, pooling 3, bicubic resize, pixels in
[0, 1]; 16 kHz, 20 ms frames every 10 ms, 512-point FFT, 128 HTK mel filters over 0-8 kHz, log(mel + 0.001)).
tests/test_media.py compares both with transformers on the same inputs. Inputs neither can take are refused with a
one-line UsageError naming the input and what is accepted.
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import numbers
import os
import struct
from typing import Iterator, Sequence, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mtpkit.errors import UsageError, check_int

PATCH = 16  # pixels per patch side
POOL = 3  # the encoder averages 3 x 3 patches into one soft token
BUDGETS = (70, 140, 280, 560, 1120)  # soft tokens per image transformers accepts (max_soft_tokens)
DEFAULT_BUDGET = 280

SAMPLE_RATE = 16_000
FRAME = 320  # 20 ms
HOP = 160  # 10 ms
FFT = 512  # the power of two at or above FRAME
MEL_BINS = 128
MAX_FREQUENCY = 8000.0  # the top mel filter's upper edge
MEL_FLOOR = 1e-3
MAX_SAMPLES = 480_000  # 30 s: transformers cuts a clip there
PAD_MULTIPLE = 128  # transformers pads a clip with zeros to a multiple of 128 samples

ImageInput = Union[str, "os.PathLike[str]", bytes, Image.Image, np.ndarray]
ACCEPTED_IMAGES = "an image file (path or bytes), a PIL image, or a uint8 array (height, width[, 1|3|4])"
# what Pillow raises on a broken file, by its own fuzzing tests' account
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError)


# ---- images ----------------------------------------------------------------------------------------------------

def image_patches(image: ImageInput, budget: int = DEFAULT_BUDGET) -> tuple[np.ndarray, np.ndarray, int]:
    """(patches float32 [budget * 9, 768], positions_xy int32 [budget * 9, 2], soft_tokens) of one image: what
    transformers returns as pixel_values, image_position_ids and num_soft_tokens_per_image.

    The image is resized to `resized_size` (Pillow bicubic) unless it has that size already, scaled to [0, 1] and
    cut into 16 x 16 patches in row-major grid order; a patch row holds its pixels row by row, RGB interleaved, and
    its position is (x, y) in the patch grid. Rows past the image's own patches are 0 with position (-1, -1)."""
    max_patches = _max_patches(budget)
    rgb = image_rgb(image)
    height, width = resized_size(rgb.shape[0], rgb.shape[1], budget)
    if (height, width) != rgb.shape[:2]:
        rgb = np.asarray(Image.fromarray(rgb).resize((width, height), Image.Resampling.BICUBIC))
    pixels = (rgb.astype(np.float64) * (1 / 255)).astype(np.float32)  # transformers scales in float64
    rows, cols = height // PATCH, width // PATCH
    count = rows * cols
    patches = np.zeros((max_patches, PATCH * PATCH * 3), np.float32)
    patches[:count] = pixels.reshape(rows, PATCH, cols, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(count, -1)
    positions = np.full((max_patches, 2), -1, np.int32)
    y, x = np.divmod(np.arange(count), cols)
    positions[:count, 0], positions[:count, 1] = x, y
    return patches, positions, count // POOL**2


def resized_size(height: int, width: int, budget: int = DEFAULT_BUDGET) -> tuple[int, int]:
    """The (height, width) transformers resizes a height x width image to: the largest multiples of 48 (patch x
    pooling) in the image's aspect ratio that fit budget * 9 patches. A side that would round to 0 becomes 48 and
    the other floor(long / short) * 48, at most budget * 48: a 1 x 10000 image becomes 48 x 13440 at budget 280."""
    target = _max_patches(budget) * PATCH**2
    height = check_int("image height", height, 1)
    width = check_int("image width", width, 1)
    factor = math.sqrt(target / (height * width))
    side = POOL * PATCH
    new_height = int(math.floor(factor * height / side)) * side
    new_width = int(math.floor(factor * width / side)) * side
    # both cannot be 0: their ideal product is the budget's area, above 48 * 48
    if new_height == 0:
        return side, min(int(math.floor(width / height)) * side, budget * side)
    if new_width == 0:
        return min(int(math.floor(height / width)) * side, budget * side), side
    return new_height, new_width


def image_soft_tokens(height: int, width: int, budget: int = DEFAULT_BUDGET) -> int:
    """Soft tokens a height x width image takes, without decoding it (transformers' _get_num_multimodal_tokens)."""
    new_height, new_width = resized_size(height, width, budget)
    return (new_height // PATCH) * (new_width // PATCH) // POOL**2


def image_rgb(image: ImageInput) -> np.ndarray:
    """uint8 [height, width, 3] of an image, as transformers takes each kind of input.

    A file (path, or its bytes) is decoded, turned upright by its EXIF orientation and converted to RGB as
    transformers' load_image does; then, like a PIL image, it goes through the processor's convert_to_rgb, which
    composites an image with alpha or a transparent colour onto white. An array is taken channels last; one channel
    is repeated, a fourth is alpha composited onto white (rounded to the nearest integer)."""
    if isinstance(image, np.ndarray):
        rgb = _array_rgb(image)
        name = f"image array {image.shape}"
    elif isinstance(image, Image.Image):
        name = "PIL image"
        with _decoding(name):
            rgb = _composite_white(image)
    elif isinstance(image, (bytes, bytearray, memoryview)):
        name = f"image bytes ({len(image)} bytes)"
        with _decoding(name):
            rgb = _composite_white(_load(io.BytesIO(bytes(image))))
    elif isinstance(image, (str, os.PathLike)):
        name = f"image file {os.fspath(image)!r}"
        if not os.path.isfile(image):
            raise UsageError(f"{name} does not exist or is not a file; give {ACCEPTED_IMAGES}")
        with _decoding(name):
            rgb = _composite_white(_load(image))
    else:
        raise UsageError(f"image of type {type(image).__name__} is not accepted; give {ACCEPTED_IMAGES}")
    if rgb.size == 0:
        raise UsageError(f"{name} has no pixels ({rgb.shape[1]} x {rgb.shape[0]}); give {ACCEPTED_IMAGES}")
    return rgb


def _load(source: str | os.PathLike[str] | io.BytesIO) -> Image.Image:
    """transformers' load_image on a file: decode, EXIF orientation, RGB (alpha dropped, not composited)."""
    with Image.open(source) as opened:
        opened.load()  # decode now, so a truncated file fails here and not later
        return ImageOps.exif_transpose(opened).convert("RGB")


def _composite_white(image: Image.Image) -> np.ndarray:
    """transformers' convert_to_rgb on a PIL image: alpha, or a transparent colour kept in `info`, onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return np.asarray(image.convert("RGB"))


@contextlib.contextmanager
def _decoding(name: str) -> Iterator[None]:
    """Pillow's failures on a broken or hostile file turned into one line naming the input."""
    try:
        yield
    except UnidentifiedImageError:
        raise UsageError(f"{name} is not an image Pillow can read; give {ACCEPTED_IMAGES}") from None
    except _DECODE_ERRORS as e:
        reason = " ".join(str(e).split()) or type(e).__name__  # Pillow's message, on one line
        raise UsageError(f"{name} cannot be decoded ({reason}); give {ACCEPTED_IMAGES}") from None


def _array_rgb(image: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] of a channels-last uint8 array, as transformers' convert_to_rgb does on arrays."""
    channels = image.shape[2] if image.ndim == 3 else 1
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or channels not in (1, 3, 4):
        raise UsageError(f"image array of dtype {image.dtype} and shape {image.shape} is not accepted; give "
                         f"{ACCEPTED_IMAGES}, channels last (float pixels: (x * 255).round().astype(np.uint8))")
    pixels = image.reshape(image.shape[0], image.shape[1], channels)
    if channels == 1:
        return np.repeat(pixels, 3, axis=2)
    if channels == 4:
        alpha = pixels[..., 3:4] / 255
        return np.round(alpha * pixels[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return np.ascontiguousarray(pixels)


def _max_patches(budget: object) -> int:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget not in BUDGETS:
        raise UsageError(f"image token budget must be one of {', '.join(map(str, BUDGETS))} (got {budget!r})")
    return int(budget) * POOL**2


# ---- audio -----------------------------------------------------------------------------------------------------

def audio_features(samples: np.ndarray | Sequence[float], sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(mel float32 [frames, 128], mask bool [frames]) of a mono 16 kHz clip: what transformers returns as
    input_features and input_features_mask for a batch of one.

    The clip is cut at 30 s, padded with zeros to a multiple of 128 samples, and 160 zeros go in front, so frame i
    covers samples [160 i - 160, 160 i + 160): Hann window (periodic), 512-point FFT magnitude, 128 triangular HTK mel
    filters over 0-8 kHz, log(mel + 0.001). Frame i is valid (mask True) when sample 160 i + 160, the one after it,
    is real audio; an invalid frame's features are 0. A clip shorter than 161 samples has no valid frame."""
    wave = _mono(samples, sample_rate)
    n = min(wave.size, MAX_SAMPLES)
    padded = -(-n // PAD_MULTIPLE) * PAD_MULTIPLE
    signal = np.zeros(FRAME // 2 + padded, np.float32)
    signal[FRAME // 2:FRAME // 2 + n] = wave[:n]
    frames = max((signal.size - (FRAME + 1)) // HOP + 1, 0)  # transformers unfolds FRAME + 1 samples per frame
    starts = np.arange(frames) * HOP
    windows = signal[starts[:, None] + np.arange(FRAME)] * _window()
    magnitude = np.abs(np.fft.rfft(windows, n=FFT, axis=-1))
    mel = np.log(magnitude @ _mel_filters() + MEL_FLOOR).astype(np.float32)
    mask = starts + FRAME < FRAME // 2 + n  # the unfold's last sample, index start + FRAME, is real audio
    return mel * mask[:, None], mask


def audio_soft_tokens(mask: np.ndarray) -> int:
    """Soft tokens a clip takes: its mask through the encoder's two stride-2 convolutions (every 4th frame), counted
    where valid, as transformers' processor places them (replace_audio_token); at most 750 for 30 s."""
    return int(np.asarray(mask, bool)[::4].sum())


def _mono(samples: object, sample_rate: object) -> np.ndarray:
    """The clip as float32 [n], or one line saying why it cannot be taken."""
    rate = check_int("audio sample rate", sample_rate, 1)
    if rate != SAMPLE_RATE:
        raise UsageError(f"audio sample rate {rate} Hz is not accepted: the audio encoder takes {SAMPLE_RATE} Hz; "
                         "resample the clip first (transformers does not resample either)")
    wave = np.asarray(samples)
    if wave.dtype.kind != "f":
        raise UsageError(f"audio samples of dtype {wave.dtype} are not accepted; give floating-point samples in "
                         "[-1, 1] (16-bit PCM: divide by 32768)")
    if wave.ndim == 2 and 1 in wave.shape:
        wave = wave.reshape(-1)
    if wave.ndim != 1:
        channels = min(wave.shape) if wave.ndim == 2 else "several"
        raise UsageError(f"audio of shape {wave.shape} has {channels} channels; the audio encoder takes one (mono): "
                         "mix them down first, e.g. samples.mean(axis=channel_axis)")
    if wave.size == 0:
        raise UsageError("audio has no samples; give a mono 16 kHz clip of at least 161 samples (10 ms)")
    if not np.isfinite(wave).all():
        raise UsageError("audio has NaN or infinite samples; give finite samples in [-1, 1]")
    return wave.astype(np.float32)  # transformers pads in float32


@functools.lru_cache(maxsize=1)
def _window() -> np.ndarray:
    """Periodic Hann window of FRAME samples, float32 (transformers' window_function)."""
    return np.hanning(FRAME + 1)[:-1].astype(np.float32)


@functools.lru_cache(maxsize=1)
def _mel_filters() -> np.ndarray:
    """float64 [FFT // 2 + 1, MEL_BINS]: triangles between MEL_BINS + 2 points evenly spaced on the HTK mel scale
    from 0 to 8 kHz, unnormalized (transformers' mel_filter_bank, norm=None)."""
    mels = np.linspace(0.0, 2595.0 * np.log10(1.0 + MAX_FREQUENCY / 700.0), MEL_BINS + 2)
    edges = 700.0 * (np.power(10, mels / 2595.0) - 1.0)
    bins = np.linspace(0, SAMPLE_RATE // 2, FFT // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    return np.maximum(np.zeros(1), np.minimum(down, up))
