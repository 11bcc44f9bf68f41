"""``exporter generate``: text from a generating artifact (``--task text-generation``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from exporter.cli.common import (DEBUG, JSON, PRELOAD, QUIET, VERBOSE, app, guarded, print_json,
                                 say, warn)

ARTIFACT = typer.Argument(..., help="artifact built with --task text-generation")


@app.command()
def generate(
    artifact: Path = ARTIFACT,
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="the prompt text "
                                         "(tokenized with the artifact's own tokenizer)"),
    prompt_ids: Optional[str] = typer.Option(None, "--prompt-ids", help="the prompt as token "
                                             "ids, comma-separated (no tokenizer needed)"),
    source: Optional[str] = typer.Option(None, "--source", help="an encoder-decoder's "
                                         "source text (translation, summary: what it encodes)"),
    source_ids: Optional[str] = typer.Option(None, "--source-ids", help="an encoder-decoder's "
                                             "source as token ids, comma-separated"),
    source_features: Optional[str] = typer.Option(None, "--source-features", help="a speech "
                                                  "encoder's input features (.npy or "
                                                  ".safetensors; Whisper: its log-mel frames)"),
    source_audio: Optional[str] = typer.Option(None, "--source-audio", help="a Whisper "
                                               "artifact's audio: a PCM WAV file at its rate "
                                               "(16 kHz); cut or padded to 30 s"),
    language: Optional[str] = typer.Option(None, "--language", help="Whisper: the language "
                                           "of the speech (a code: en, fr, ...); by default "
                                           "detected, as transformers does"),
    speech_task: Optional[str] = typer.Option(None, "--task", help="Whisper: transcribe or "
                                              "translate (to English)"),
    # The ranges are checked by Sampling and generate, not by the parser: one error style,
    # and a JSON error object under --json (docs/json.md)
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", "-n", help="stop after this many new tokens (0 or more; "
        "default: the checkpoint's max_new_tokens, else 128)"),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; above 0 (up to "
                                      "100): sample"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="sample among the k (1 or "
                                        "more) most likely tokens"),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="sample from the smallest "
                                          "set with this mass, in (0, 1]"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the sampling draws"),
    stop: list[str] = typer.Option([], "--stop", help="stop when the text contains this "
                                   "(repeatable)"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="go on past end-of-sequence"),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs",
                                        help="decode without CUDA-graph replay"),
    trusted_key: list[Path] = typer.Option([], "--trusted-key", help="require a signature by "
                                           "this public key (repeatable)"),
    preload: list[str] = PRELOAD,
    as_json: bool = JSON, quiet: bool = QUIET, verbose: bool = VERBOSE, debug: bool = DEBUG,
) -> None:
    """Generate text: prefill the prompt, then decode token by token (streamed). An
    encoder-decoder (Whisper, BART, T5, ...) encodes --source first; --prompt is then its
    decoder's (by default the decoder start token)."""
    def action() -> int:
        import runtime
        from runtime.generation import parse_prompt, parse_source

        from runtime.__main__ import preload as preload_modules

        preload_modules(preload)
        encoded = parse_source(source, source_ids, source_features, source_audio)
        sampling = _sampling(temperature, top_k, top_p, seed)
        program = runtime.load(artifact, cuda_graphs=not no_cuda_graphs,
                               trusted_keys=trusted_key)
        # an encoder-decoder's decoder prompt may be left out (it starts on its own)
        tokens = parse_prompt(prompt, prompt_ids, optional="encode" in program.entry_points)
        streaming = not as_json and not quiet
        generated = program.generate(tokens, max_new_tokens, sampling=sampling, stop=stop,
                                     stop_at_eos=not ignore_eos,
                                     stream=_printer() if streaming else None,
                                     language=language, task=speech_task,
                                     **({"source": encoded} if encoded is not None else {}))
        if as_json:
            print_json(generated.to_json())
            return 0
        if streaming:  # flushed: the stats line goes to stderr, after the text
            sys.stdout.write("\n")
            sys.stdout.flush()
        else:
            print(generated.text if generated.text is not None else
                  " ".join(map(str, generated.tokens)))
        stats = generated.stats
        say(f"{len(generated.tokens)} tokens ({generated.stop_reason}); prompt "
            f"{len(generated.prompt_tokens)} tokens in {stats['ttft_s'] * 1000:.1f} ms; "
            f"decode {stats['decode_tokens_per_s'] or '-'} tokens/s")
        return 0
    guarded(action, quiet=quiet, verbose=verbose, debug=debug, as_json=as_json)


def _sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None):
    """The flags as a Sampling (which checks their ranges); sampling flags on a greedy run
    are said, not dropped in silence."""
    from runtime.generation.sampling import Sampling
    sampling = Sampling(temperature, top_k, top_p, seed)
    if sampling.greedy and (top_k is not None or top_p is not None or seed is not None):
        warn("--top-k, --top-p and --seed shape sampling, and --temperature 0 is greedy: "
             "give a temperature above 0 to sample")
    return sampling


def _printer():
    def stream(token: int | None, piece: str | None) -> None:
        sys.stdout.write(piece if piece is not None else f"{token} ")
        sys.stdout.flush()
    return stream
