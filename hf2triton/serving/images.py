"""A request's images decoded and checked (the image tasks): each row of the IMAGE tensor is one encoded image, read
with Pillow as transformers' pipelines read theirs (`load_image`: EXIF orientation applied, converted to RGB).

The size is bounded before any pixel is decoded: `Image.open` reads the header only, so an image whose width x height
exceeds max_image_pixels (a decompression bomb: a few kilobytes of PNG that decode to gigabytes) is refused from its
header. Pillow's own bomb guard (Image.MAX_IMAGE_PIXELS) is set to the same bound, for formats whose frames differ in
size from the header's (beyond twice the bound it refuses an image from its header itself). Only the common still-image
formats are opened (no EPS/PDF-like decoders on the server). A problem with one image raises RequestError: its request
gets the error, the rest of the batch is unaffected.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np

from .inputs import RequestError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # what Image.open may identify an image as


def decode_image(raw: Any, max_pixels: int, index: int = 0) -> Any:
    """One encoded image -> an RGB PIL image (EXIF orientation applied), refused beyond `max_pixels` before decoding."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(raw, str) or not isinstance(raw, (bytes, np.bytes_)):
        raise RequestError(f"image {index}: input 'image' must be BYTES (the encoded image file), got {type(raw).__name__}")
    if not raw:
        raise RequestError(f"image {index} is empty: send the bytes of a PNG or JPEG file")
    Image.MAX_IMAGE_PIXELS = max_pixels  # Pillow's bomb guard: DecompressionBombError beyond 2x (a warning beyond 1x)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # 1x-2x: refused below, naming the size
            image = Image.open(io.BytesIO(bytes(raw)), formats=FORMATS)
            width, height = image.size
            if width * height > max_pixels:
                raise RequestError(
                    f"image {index} is {width}x{height} = {width * height} pixels, more than max_image_pixels={max_pixels}: "
                    "send a smaller image (the model resizes it anyway)"
                )
            image = ImageOps.exif_transpose(image)  # as transformers' load_image
            return image.convert("RGB")  # decodes
    except RequestError:
        raise
    except Image.DecompressionBombError as err:  # over 2x the bound: Pillow refuses it from the header itself
        raise RequestError(f"image {index} is more than max_image_pixels={max_pixels} ({err}): send a smaller image") from None
    except UnidentifiedImageError:
        head = bytes(raw[:16])
        raise RequestError(
            f"image {index} ({len(raw)} bytes, starting {head!r}) is not an image Pillow can read as {', '.join(FORMATS)}: "
            "send the file's bytes (a PNG or JPEG), not text or a path"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:  # truncated or corrupt data
        raise RequestError(f"image {index} could not be decoded ({type(err).__name__}: {err}): send a complete PNG or JPEG file") from None


def decode_images(values: np.ndarray, max_pixels: int) -> list[Any]:
    """The images of a request (rows of the IMAGE tensor), each decoded and checked."""
    images = [decode_image(item, max_pixels, index) for index, item in enumerate(values.reshape(-1))]
    if not images:
        raise RequestError("request holds no image")
    return images
