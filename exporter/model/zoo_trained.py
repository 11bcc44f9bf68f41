"""Zoo models with trained weights, to judge quantization's accuracy gate on.

Random weights say little about accuracy (a random-weight ResNet-50 kept cosine 0.69
after PT2E int8 while trained encoders keep 0.999), so the zoo's CNN and encoder are
also shipped trained, briefly, on synthetic tasks (no downloads): ``zoo:cnn-trained``
and ``zoo:encoder-trained``. The weights (``zoo_weights/*.safetensors``, under 1 MB)
come from ``python -m exporter.model.zoo_trained`` (seeded; it prints the accuracy reached).

- CNN: 10 classes; an image is noise plus a bright 8x8 square at one of 10 places.
- Encoder: 4 classes; which quarter of the vocabulary most of the tokens come from,
  read from the pooled output by a linear head used only for training.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from exporter.model.zoo import BATCH, HIDDEN, SEQ, VOCAB, make_cnn, make_encoder

WEIGHTS_DIR = Path(__file__).resolve().parent / "zoo_weights"
_PLACES = [(r, c) for r in (2, 12, 22) for c in (2, 12, 22)] + [(12, 17)]  # 10 squares
ENCODER_CLASSES = 4


def cnn_task(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, len(_PLACES), (n,), generator=generator)
    images = 0.5 * torch.randn(n, 3, 32, 32, generator=generator)
    for i, label in enumerate(labels.tolist()):
        r, c = _PLACES[label]
        images[i, :, r:r + 8, c:c + 8] += 2.0
    return images, labels


def encoder_task(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, ENCODER_CLASSES, (n,), generator=generator)
    quarter = VOCAB // ENCODER_CLASSES
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=generator)
    majority = torch.rand(n, SEQ, generator=generator) < 0.6
    home = labels[:, None] * quarter + torch.randint(0, quarter, (n, SEQ), generator=generator)
    return torch.where(majority, home, ids), labels


def _cnn_trained():
    model, _, dynamic = make_cnn()
    model.load_state_dict(load_file(str(WEIGHTS_DIR / "cnn.safetensors")))
    images, _ = cnn_task(BATCH, torch.Generator().manual_seed(1))
    return model.eval(), (images,), dynamic


def _encoder_trained():
    model, _, dynamic = make_encoder()
    model.load_state_dict(load_file(str(WEIGHTS_DIR / "encoder.safetensors")))
    ids, _ = encoder_task(BATCH, torch.Generator().manual_seed(1))
    return model.eval(), (ids, torch.ones_like(ids)), dynamic


TRAINED = {"cnn-trained": _cnn_trained, "encoder-trained": _encoder_trained}
DESCRIPTIONS = {"cnn-trained": "zoo:cnn trained on a synthetic 10-class task (for accuracy)",
                "encoder-trained": "zoo:encoder trained on a synthetic 4-class task "
                                   "(for accuracy)"}


def task_inputs(name: str, n: int, seed: int = 2) -> dict[str, torch.Tensor]:
    """Inputs drawn from a trained model's task, by input name (calibration, tests)."""
    generator = torch.Generator().manual_seed(seed)
    if name == "cnn-trained":
        return {"image": cnn_task(n, generator)[0]}
    ids, _ = encoder_task(n, generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


class _EncoderWithHead(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, nn.Linear(HIDDEN, ENCODER_CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids, torch.ones_like(ids))["pooled"])


def train(steps: int = 300, batch: int = 64) -> dict[str, float]:
    """Train both, save their weights, return the held-out accuracy of each."""
    torch.manual_seed(0)
    WEIGHTS_DIR.mkdir(exist_ok=True)
    cnn = make_cnn()[0]
    encoder = make_encoder()[0]
    jobs = {"cnn": (cnn, cnn, cnn_task), "encoder": (encoder, _EncoderWithHead(encoder),
                                                     encoder_task)}
    accuracy = {}
    for name, (model, trainee, task) in jobs.items():
        generator = torch.Generator().manual_seed(0)
        optimizer = torch.optim.AdamW(trainee.parameters(), lr=3e-3)
        trainee.train()
        for _ in range(steps):
            x, y = task(batch, generator)
            loss = nn.functional.cross_entropy(trainee(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        trainee.eval()
        with torch.no_grad():
            x, y = task(1000, torch.Generator().manual_seed(99))
            accuracy[name] = float((trainee(x).argmax(1) == y).float().mean())
        save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                  str(WEIGHTS_DIR / f"{name}.safetensors"))
    return accuracy


if __name__ == "__main__":
    print(train())
