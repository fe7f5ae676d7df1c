"""Small PNG charts drawn with numpy and zlib (no plotting library): the k*/K histogram of the dataset
card, pass rates per guidance kind and the loss curves of the assets' metadata."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np

# A 3x5 pixel font, rows top to bottom: enough for numbers, bin edges and short axis names.
_GLYPHS = {"0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
           "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
           "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "-": "000000111000000",
           "k": "100101110101101", "K": "101101110101101", "*": "000101010101000", "/": "001001010100100",
           "e": "010101111100011", "+": "000010111010000"}
LINE_COLOURS = ((66, 110, 180), (200, 80, 50), (60, 150, 80), (140, 90, 170))


def draw_text(image: np.ndarray, x: int, y: int, text: str, scale: int = 2) -> None:
    """Black `text` with its top-left corner at (x, y); characters the font lacks leave a gap."""
    for char in text:
        for i, bit in enumerate(_GLYPHS.get(char, "")):
            if bit == "1":
                row, col = divmod(i, 3)
                image[y + row * scale:y + (row + 1) * scale, x + col * scale:x + (col + 1) * scale] = 0
        x += 4 * scale


def line_chart_png(series: list[list[float]], width: int = 600, height: int = 300) -> bytes:
    """Each series a coloured line over its index (e.g. loss per step), on shared axes labelled with the
    value range and the last step; an empty or all-NaN input gives an empty chart."""
    image = np.full((height, width, 3), 255, np.uint8)
    left, right, top, bottom = 70, 10, 20, 30
    image[height - bottom:height - bottom + 2, left:width - right] = 0
    image[top:height - bottom, left - 2:left] = 0
    values = np.array([v for s in series for v in s], float)
    values = values[np.isfinite(values)]
    if values.size:
        low, high = float(values.min()), float(values.max())
        span, steps = (high - low) or 1.0, max(max(len(s) for s in series) - 1, 1)
        for colour, s in zip(LINE_COLOURS * len(series), series):
            points = [(left + round(i / steps * (width - left - right - 1)),
                       height - bottom - 1 - round((v - low) / span * (height - top - bottom - 1)))
                      for i, v in enumerate(s) if np.isfinite(v)]
            for (x0, y0), (x1, y1) in zip(points, points[1:] or points):
                n = max(abs(x1 - x0), abs(y1 - y0), 1)
                for t in np.linspace(0, 1, n + 1):
                    x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
                    image[max(y - 1, 0):y + 1, max(x - 1, 0):x + 1] = colour
        draw_text(image, 4, top, f"{high:.3g}")
        draw_text(image, 4, height - bottom - 10, f"{low:.3g}")
        draw_text(image, width - right - 4 * 2 * len(str(steps)), height - bottom + 8, str(steps))
    return png(image)


def bar_chart_png(values: list[float], width: int = 600, height: int = 300) -> bytes:
    """One bar per value (shares in [0, 1] drawn to full height at 1), each labelled with its percentage."""
    image = np.full((height, width, 3), 255, np.uint8)
    left, bottom, top = 20, 30, 30
    base = height - bottom
    image[base:base + 2, left - 4:width - 10] = 0
    slot = (width - left - 10) // max(len(values), 1)
    for i, value in enumerate(values):
        x, bar = left + i * slot, round((base - top) * min(max(value, 0.0), 1.0))
        image[base - bar:base, x + 6:x + slot - 6] = LINE_COLOURS[i % len(LINE_COLOURS)]
        draw_text(image, x + 8, base - bar - 14, f"{value * 100:.0f}")
        draw_text(image, x + 8, base + 8, str(i + 1))
    return png(image)


def markdown_image(data: bytes, title: str) -> str:
    """A PNG inline in Markdown (what Dagster's metadata shows as a picture)."""
    return f"![{title}](data:image/png;base64,{base64.b64encode(data).decode()})"


def png(image: np.ndarray) -> bytes:
    """An 8-bit RGB PNG: each scanline prefixed with filter type 0, deflated into one IDAT chunk."""
    height, width, _ = image.shape
    raw = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
