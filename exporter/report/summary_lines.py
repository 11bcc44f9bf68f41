"""One-line summaries a build, inspect and the report share: the validation verdict (and
its note on random inputs), and what an hf: loader chose for the example inputs."""

from __future__ import annotations

def validation_lines(record: dict | None, verbose: bool = True) -> list[str]:
    """The verdict and its worst figure; the policy's formula only ``verbose``."""
    if not record or record.get("skipped"):
        return ["validation: skipped"]
    verdict = "PASSED" if record["passed"] else "FAILED"
    if record.get("kind") == "generation":
        lines = _generation_lines(record, verdict)
        return lines if verbose else [line for line in lines if not line.startswith("  policy:")]
    cases = ", ".join(c["name"] for c in record.get("cases", []))
    rows = record.get("outputs", [])
    quantized = [r for r in rows if r.get("criterion") == "quantized"]
    if quantized:
        top1 = [r["top1_agreement"] for r in quantized if "top1_agreement" in r]
        figures = (f"worst SQNR {min(r['sqnr_db'] for r in quantized):.1f} dB, worst cosine "
                   f"{min(r['cosine'] for r in quantized):.5f}"
                   + (f", top-1 agreement {min(top1):.1%}" if top1 else ""))
    else:
        worst = max((r.get("ratio_to_allowed", 0.0) for r in rows), default=0.0)
        figures = f"worst float error used {worst:.1%} of its allowance"
    lines = [f"validation: {verdict} against eager (reference {record.get('reference_dtype')}) "
             f"on {len(record.get('cases', []))} input set(s): {cases}",
             f"  {figures}" + (f"; policy: {record['policy']}" if verbose else "")]
    if record.get("reference_note"):
        lines.append(f"  note: {record['reference_note']}")
    return lines + random_note(record)


def random_note(record: dict) -> list[str]:
    """Said once, where random inputs were drawn: what they are and how to give real ones."""
    drawn = [c["name"] for c in record.get("cases", []) if c.get("origin", "").startswith(
        "random")]
    if not drawn or any(c.get("origin") == "user" for c in record.get("cases", [])):
        return []
    return [f"  note: {' and '.join(drawn)} are random draws at the dynamic dims' bounds, "
            "which can hide errors real data shows: give real inputs with --inputs FILE.npz "
            "(numpy.savez, arrays named as the inputs)"]


def _generation_lines(record: dict, verdict: str) -> list[str]:
    rows = record["outputs"]
    same = sum(r["tokens_match"] for r in rows)
    lengths = ", ".join(str(r["prompt_tokens"]) for r in rows)
    each = f"{rows[0]['new_tokens']} new tokens each" + (
        f" ({rows[-1]['new_tokens']} for the last, to the context's end)"
        if rows[-1]["new_tokens"] != rows[0]["new_tokens"] else "")
    lines = [f"validation: {verdict}: generation from {record['cases']} prompts ({lengths} "
             f"tokens), {each}, against Hugging Face "
             f"generate: {same} of {len(rows)} token for token; teacher-forced top-1 agreement "
             f"{record['top1_agreement']:.1%}, mean KL {record['mean_kl']:.2e}",
             f"  policy: {record['policy']}"]
    return lines + [f"  note: {note}" for note in record.get("warnings", [])]


def model_line(source: dict) -> str | None:
    """What a loader chose that the user may not have asked for (hf: the task, the model
    class, the example shapes), or None for a model the user built and shaped."""
    if "task" not in source:
        return None
    if "max_context" in source:  # --task text-generation
        encoder = source.get("encoder")  # an encoder-decoder's encode entry point
        encode = "" if encoder is None else (
            f"; encode ({encoder['input']} [1, {', '.join(map(str, encoder['shape']))}]) "
            if encoder["input"] != "input_ids" else
            f"; encode (input_ids, up to {encoder['bound']} tokens) ") + (
            "" if encoder is None else "fills their cross-attention cache")
        steps = (f"prefill (1..{source['prefill_chunk']} tokens, --prefill-chunk N), which "
                 "also decodes," if source.get("decode_on_prefill") else
                 f"prefill (2..{source['prefill_chunk']} tokens, --prefill-chunk N) and decode "
                 "(1 token)")
        return (f"model: {source.get('model_class')}, task {source['task']}; entry points "
                f"{steps} over a KV cache of {source['max_context']} tokens (--max-context N)"
                + encode)
    return (f"model: {source.get('model_class')}, task {source['task']} (--task); "
            f"example inputs: {_example_shapes(source)}")


def _example_shapes(source: dict) -> str:
    """hf: the example inputs' sizes, which are dynamic (and how the rest would be)."""
    dynamic = source.get("dynamic_dims") or {}
    parts = {"batch": (f"batch {source.get('batch_size', 1)}", "--batch-size N")}
    if "seq_len" in source:
        parts["sequence"] = (f"sequence {source['seq_len']}", "--seq-len N")
    shown, static = [], []  # static: (its text's index in shown, its flag, its --dynamic)
    for name, (text, flag) in parts.items():
        if name not in dynamic:
            static.append((len(shown), flag, f"--dynamic {name}=MIN..MAX"))
            shown.append(text)
            continue
        lo, hi = dynamic[name]
        pad = (f"; pad a shorter text to {lo} tokens, attention_mask 0 on the padding"
               if name == "sequence" and lo > 1 else "")
        shown.append(f"{text} (dynamic {lo}..{hi}{pad})")
    if "seq_len" not in source:
        static.append((len(shown), "--image-size N", None))
        shown.append(f"{source.get('image_size')}-pixel images")
    if not static:
        return ", ".join(shown)
    if not dynamic:
        return ", ".join(shown) + ", static " + _flags(static)
    for index, *flags in static:  # "static" beside each static one, not after the last
        shown[index] += " static " + _flags([flags])
    return ", ".join(shown)


def _flags(static: list) -> str:
    """``(--seq-len N; dynamic: --dynamic sequence=MIN..MAX)``: how to set or free them."""
    dynamics = ", ".join(row[-1] for row in static if row[-1])
    return (f"({', '.join(row[-2] for row in static)}"
            + (f"; dynamic: {dynamics})" if dynamics else ")"))
