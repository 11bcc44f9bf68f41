"""Where a tiny T5 generating artifact's numbers leave eager's: the encoder's cross keys
and teacher-forced logits (one-token steps only, and after a prefill of 3 or 7 tokens),
per source length, against eager on the CPU (and on the GPU, when there is one).
Made to narrow down T5 on cuda:

    PYTHONPATH=. exporter build tests/models/tiny_seq2seq.py:t5 --task text-generation \
        --target cuda --max-context 48 --no-validate --out /tmp/t5.artifact
    python bench/seq2seq_step_check.py /tmp/t5.artifact
"""
import sys, torch
sys.path[:0] = [".", "tests"]
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
import runtime
from models import tiny_seq2seq as ts
DEV = "cuda" if torch.cuda.is_available() else "cpu"
cpu = ts.t5().eval(); gpu = ts.t5().eval().to(DEV)
p = runtime.load(sys.argv[1]); g = p.generator
enc = p.entry_points["encode"]
print("encode inputs", [(s.name, [str(d) for d in s.shape]) for s in enc.manifest.signature.inputs])
print("encode outputs", [s.name for s in enc.manifest.signature.outputs][:4])
gen = torch.Generator().manual_seed(3)
for L in (1024, 300, 37, 7):
    ids = torch.randint(2, 300, (1, L), generator=gen)
    out = enc.run([ids.to(DEV)])
    with torch.no_grad():
        hc = cpu.encoder(input_ids=ids).last_hidden_state
        hg = gpu.encoder(input_ids=ids.to(DEV)).last_hidden_state
        errs = []
        for i, block in enumerate(cpu.decoder.block):
            att = block.layer[1].EncDecAttention
            kc = att.k(hc).view(1, L, att.n_heads, att.key_value_proj_dim).transpose(1, 2)
            name = [s.name for s in enc.manifest.signature.outputs][2 * i]
            ka = out[name].float().cpu()
            errs.append(float((ka - kc).abs().max()))
        print(f"L={L}: encoder hidden eager gpu-cpu {float((hg.cpu() - hc).abs().max()):.2e}; cross k artifact-cpu per layer", [f"{e:.2e}" for e in errs])
        cont = torch.randint(2, 300, (12,), generator=gen).tolist()
        for cut in (2, 6):  # a prefill of T = cut + 1 >= 2 tokens, then teacher forcing
            g.set_source(ids[0].tolist())
            art = g.forced_logits([0] + cont[:cut], cont[cut:]).float()
            dec = torch.tensor([[0] + cont[:-1]])
            lc = cpu(input_ids=ids, decoder_input_ids=dec).logits[0][cut:]
            print(f"   prefill T={cut + 1}: per row artifact-cpu", [f"{float(x):.1e}" for x in (art - lc).abs().amax(-1)])
        g.set_source(ids[0].tolist())
        art = g.forced_logits([0], cont).float()
        dec = torch.tensor([[0] + cont[:-1]])
        lc = cpu(input_ids=ids, decoder_input_ids=dec).logits[0]
        lg = gpu(input_ids=ids.to(DEV), decoder_input_ids=dec.to(DEV)).logits[0].cpu()
        print(f"   logits: artifact-cpu {float((art - lc).abs().max()):.2e}  eager gpu-cpu {float((lg - lc).abs().max()):.2e}  per row artifact-cpu", [f"{float(x):.1e}" for x in (art - lc).abs().amax(-1)])
