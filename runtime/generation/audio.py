"""Audio in for a Whisper artifact: a WAV file or samples -> the log-mel frames its ``encode``
takes, as transformers' ``WhisperFeatureExtractor`` computes them (its numpy path: a
centred STFT with a periodic Hann window, power, Slaney mel filters, log10, the top 80 dB
kept, scaled to about [-1, 1]).

Written here with numpy, not taken from transformers: the runtime on a device has numpy and
torch, not transformers (pyproject's ``runtime`` extra).
tests/exporter/model/test_whisper.py checks it against ``WhisperFeatureExtractor`` on a
30-second waveform. The build records the
parameters (``manifest.generation.source.audio``); the mel filters are recomputed from
them (201 x 80 numbers need no entry of their own).

A WAV file is read as far as the window goes: ``read_wav`` reads its header, and the
frames of the window (30 s for Whisper) are read and converted when the features are
computed, so memory follows the window, not the file's size or its header's claim.
"""

from __future__ import annotations

import logging
import os
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.errors import UserInputError

log = logging.getLogger(__name__)

MEL_FLOOR = 1e-10
TOP_DB = 8.0  # log10 units kept below the loudest frame: 80 dB


@dataclass(frozen=True)
class PcmData:
    """A WAV file's data chunk, located by its header and read only as far as asked: a
    recording of hours costs the memory of the window the model takes, not of the file."""
    path: Path
    offset: int  # where the frames start in the file
    frames: int  # the frames the file holds (at most what its header claims)
    claimed: int  # the frames the header claims
    channels: int
    width: int  # bytes per sample

    def read(self, count: int) -> np.ndarray:
        """The first ``count`` frames (at most), channels averaged, as float64 in [-1, 1]."""
        count = min(count, self.frames)
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(count * self.channels * self.width)
        kind, offset, scale = _PCM_KINDS[self.width]
        usable = len(data) // (self.channels * self.width) * self.channels * self.width
        samples = (np.frombuffer(data[:usable], dtype=kind).astype(np.float64) - offset) / scale
        return samples.reshape(-1, self.channels).mean(axis=1)


@dataclass(frozen=True)
class Waveform:
    """Mono samples in [-1, 1] and their rate (Hz); or, from ``read_wav``, a WAV file's
    ``data`` whose frames are read when a window asks for them (``samples`` is None)."""
    samples: np.ndarray | None
    rate: int
    data: PcmData | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        """Samples in all (for a file: the frames it holds)."""
        return self.data.frames if self.data is not None else int(np.size(self.samples))

    def first(self, count: int) -> np.ndarray:
        """At most the first ``count`` samples, as float64; only those are read or converted."""
        if self.data is not None:
            return self.data.read(count)
        return np.asarray(self.samples, dtype=np.float64).reshape(-1)[:count]


# sample width in bytes -> (numpy type, offset, scale) of WAV's PCM integers
_PCM_KINDS = {1: (np.uint8, 128.0, 128.0), 2: (np.dtype("<i2"), 0.0, 32768.0),
              4: (np.dtype("<i4"), 0.0, 2147483648.0)}
_CONVERT = "convert it: ffmpeg -i IN -ac 1 -ar 16000 -sample_fmt s16 OUT.wav"


def read_wav(path: str | Path) -> Waveform:
    """A PCM WAV file (8-, 16- or 32-bit; channels averaged) as a ``Waveform`` whose
    frames are read later, as far as the model's window goes. Only the header is read
    here: a file that is not a PCM WAV or holds no frames is refused, and a data chunk
    shorter than its header claims (a truncated copy) is said."""
    path = Path(path)
    try:
        with open(path, "rb") as fh, wave.open(fh, "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            claimed = wav.getnframes()
            offset = fh.tell()  # wave stops at the data chunk's first byte
            size = os.fstat(fh.fileno()).st_size
    except (OSError, EOFError, wave.Error) as exc:
        raise UserInputError(f"{path} is not a readable PCM WAV file ({str(exc) or 'no header'})",
                             hint=_CONVERT) from None
    if width not in _PCM_KINDS:
        raise UserInputError(f"{path}: {8 * width}-bit samples are not read here", hint=_CONVERT)
    if channels < 1 or rate < 1:
        raise UserInputError(f"{path}: its header gives {channels} channel(s) at {rate} Hz",
                             hint=_CONVERT)
    frames = min(claimed, max(0, size - offset) // (channels * width))
    if frames == 0:
        raise UserInputError(f"{path} holds no audio frames"
                             + (f" (its header claims {_duration(claimed / rate)})"
                                if claimed else ""), hint="give a recording of at least a "
                             "fraction of a second")
    if frames < claimed:
        log.warning("%s is shorter than its header says: it holds %s of audio, the header "
                    "claims %s (a truncated copy?)", path, _duration(frames / rate),
                    _duration(claimed / rate))
    return Waveform(None, rate, PcmData(path, offset, frames, claimed, channels, width))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def log_mel(waveform: Waveform, audio: dict, mels: int, frames: int) -> np.ndarray:
    """[mels, frames] float32: ``waveform`` cut or zero-padded to ``frames`` hops (30 s for
    Whisper), then the log-mel spectrogram of ``audio``'s parameters."""
    rate, n_fft, hop = audio["sampling_rate"], audio["n_fft"], audio["hop_length"]
    if waveform.rate != rate:
        raise UserInputError(f"the audio is sampled at {waveform.rate} Hz; the model takes "
                             f"{rate} Hz", hint=f"resample it: ffmpeg -i IN -ac 1 -ar {rate} "
                                                "OUT.wav")
    samples = np.zeros(frames * hop, dtype=np.float64)
    given = _checked(waveform, samples.shape[0], rate)
    samples[:given.shape[0]] = given
    padded = np.pad(samples, n_fft // 2, mode="reflect")
    count = 1 + (padded.shape[0] - n_fft) // hop
    starts = np.arange(count)[:, None] * hop + np.arange(n_fft)[None, :]
    window = np.hanning(n_fft + 1)[:-1]  # periodic
    power = np.abs(np.fft.rfft(padded[starts] * window, n=n_fft, axis=1)) ** 2
    filters = mel_filters(n_fft // 2 + 1, mels, rate, audio.get("max_frequency", 8000.0))
    spectrum = np.log10(np.maximum(MEL_FLOOR, power @ filters)).T[:, :-1]
    spectrum = np.maximum(spectrum, spectrum.max() - TOP_DB)
    return ((spectrum + 4.0) / 4.0).astype(np.float32)


def checked_features(source, shape: list[int], where: str):
    """A speech encoder's input features as a float tensor [1, *shape]: text, ids, another
    shape or an integer dtype, and values that are NaN or infinite, are refused."""
    import torch
    if isinstance(source, str) or (isinstance(source, (list, tuple)) and all(
            isinstance(t, int) for t in source)):
        raise UserInputError("this artifact's encoder takes input features, not "
                             f"{'text' if isinstance(source, str) else 'token ids'}",
                             where=where, hint="give --source-features FILE.npy "
                             "or --source-audio FILE.wav")
    value = torch.as_tensor(source)
    if value.dim() == len(shape):
        value = value[None]
    if tuple(value.shape[1:]) != tuple(shape) or not value.is_floating_point():
        raise UserInputError(f"input features of shape {tuple(value.shape)} ({value.dtype}); "
                             f"the encoder takes float {tuple(shape)}", where=where,
                             hint="compute them with the model's feature extractor (padded "
                                  "to its fixed length)")
    if not torch.isfinite(value).all():  # a NaN spectrogram transcribes as anything
        raise UserInputError(f"{int((~torch.isfinite(value)).sum())} input feature value(s) "
                             "are NaN or infinite", where=where,
                             hint="compute them again from the audio")
    return value


def _checked(waveform: Waveform, limit: int, rate: int) -> np.ndarray:
    """The samples as float64, at most ``limit`` of them: only those are read from a file.
    Nothing to hear and samples that are not numbers are refused (the spectrogram of a NaN
    is NaN everywhere, and the model then writes whatever it writes); audio past the window
    is cut with a warning, as this generator transcribes one window (transformers'
    long-form mode slides over the rest)."""
    given = waveform.first(limit)
    if given.shape[0] == 0:
        raise UserInputError("the audio has no samples", hint="give a recording of at least "
                             "a fraction of a second")
    if not np.isfinite(given).all():
        raise UserInputError(f"the audio has {int((~np.isfinite(given)).sum())} samples that "
                             "are NaN or infinite", hint="give samples in [-1, 1]")
    if waveform.length > limit:
        log.warning("the audio is %s long; only its first %s are transcribed (one window "
                    "of the model's encoder)", _duration(waveform.length / rate),
                    _duration(limit / rate))
    return given


def mel_filters(frequencies: int, mels: int, rate: int, max_frequency: float) -> np.ndarray:
    """[frequencies, mels]: triangular filters evenly spaced on the Slaney mel scale from 0
    to ``max_frequency``, each normalised to unit area (Slaney's norm)."""
    fft_hz = np.linspace(0, rate // 2, frequencies)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(max_frequency), mels + 2))
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_hz[:, None]
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:mels + 2] - edges[:mels]))[None, :]


_SLANEY_STEP = 200.0 / 3  # Hz per mel below 1 kHz
_LOG_STEP = np.log(6.4) / 27.0  # mels above 1 kHz are logarithmic


def _hz_to_mel(hz):
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _SLANEY_STEP
    return np.where(hz >= 1000.0, 1000.0 / _SLANEY_STEP + np.log(np.maximum(hz, 1e-12) / 1000.0)
                    / _LOG_STEP, linear)


def _mel_to_hz(mel):
    mel = np.asarray(mel, dtype=np.float64)
    knee = 1000.0 / _SLANEY_STEP
    return np.where(mel >= knee, 1000.0 * np.exp(_LOG_STEP * (mel - knee)), mel * _SLANEY_STEP)
