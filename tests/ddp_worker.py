"""Helpers for tests/test_train.py, and the script it runs under torchrun for the DDP checks.

``toy_next`` is a minimal real paradigm: next-token prediction over ``<sos> text <turn> speech
<eos>`` with a causal mask, whose inputs get ~20% of their speech tokens replaced by ``<mask>``
from the example's own generator, so that a wrong per-example seed shows up in the loss.

Under ``python -m torch.distributed.run --nproc_per_node 2 tests/ddp_worker.py OUT TOKENS
DURATIONS BPE [overrides...]`` every rank

1. takes one :func:`arnar.train.optimizer_step` on its half of :func:`toy_batch_examples`
   (rank r: examples 2r, 2r+1), rank 0 saving the parameters and gradients to OUT/step.pt;
2. runs :func:`arnar.train.train` on the token set with the overrides into OUT/run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from arnar.paradigms import PARADIGMS, register_paradigm
from arnar.paradigms.base import EOS, IGNORE, MASK, SOS, TURN, Example, Paradigm, Utterance, Vocab

TINY_MODEL = {"dim": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": None, "ffn_dim": 64, "rope_theta": 10000.0,
              "norm_eps": 1e-6, "dropout": 0.0, "qkv_bias": False, "cond_dim": 0}
TOY_VOCAB = Vocab(text_size=24, speech_size=16)
ADAM_EPS = 1e-4  # see test_grad_accumulation_equals_full_batch


class ToyNextToken(Paradigm):
    name = "toy_next"

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        sequence = torch.cat([torch.tensor([SOS]), self.vocab.text(utt.text), torch.tensor([TURN]),
                              self.vocab.speech(utt.speech), torch.tensor([EOS])])
        inputs, targets = sequence[:-1].clone(), sequence[1:].clone()
        targets[: len(utt.text) + 1] = IGNORE  # no loss on text
        noisy = torch.rand(len(inputs), generator=generator) < 0.2
        noisy[: len(utt.text) + 2] = False  # only speech inputs
        inputs[noisy] = MASK
        return Example(inputs, torch.arange(len(inputs)), targets)


if ToyNextToken.name not in PARADIGMS:
    register_paradigm(ToyNextToken)


def toy_utterances(n: int = 8, seed: int = 0, vocab: Vocab = TOY_VOCAB) -> list[Utterance]:
    gen = torch.Generator().manual_seed(seed)
    utts = []
    for i in range(n):
        L = int(torch.randint(2, 7, (), generator=gen))
        T = int(torch.randint(6, 20, (), generator=gen))
        utts.append(Utterance(f"spk{i % 2}_{i:04d}", f"spk{i % 2}",
                              torch.randint(0, vocab.text_size, (L,), generator=gen),
                              torch.randint(0, vocab.speech_size, (T,), generator=gen)))
    return utts


def toy_batch_examples(paradigm: Paradigm, seed: int = 7) -> list[Example]:
    """The 4 examples of 'the merged batch': batch 0 of epoch 0, positions 0..3."""
    from arnar.train import example_generator

    return [paradigm.training_example(u, example_generator(seed, 0, 0, pos))
            for pos, u in enumerate(toy_utterances(4))]


def toy_paradigm(seed: int = 0, **model: object) -> Paradigm:
    torch.manual_seed(seed)
    return ToyNextToken(TOY_VOCAB, {**TINY_MODEL, **model})


def main(argv: list[str]) -> None:
    import torch.distributed as dist

    from arnar.paradigms.base import collate
    from arnar.train import build_optimizer, compose_config, optimizer_step, train

    out, tokens, durations, bpe, *overrides = argv
    out = Path(out)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    paradigm = toy_paradigm()
    model = torch.nn.parallel.DistributedDataParallel(paradigm)
    optimizer = build_optimizer(paradigm, lr=1e-3, weight_decay=0.1, eps=ADAM_EPS)
    examples = toy_batch_examples(paradigm)
    half = collate(examples[2 * rank: 2 * rank + 2])
    result = optimizer_step(model, optimizer, [half], lr=1e-3, grad_clip=1.0, world_size=world)
    if rank == 0:
        torch.save({"params": {k: v.detach().clone() for k, v in paradigm.named_parameters()},
                    "grads": {k: v.grad.clone() for k, v in paradigm.named_parameters()},
                    "loss": result.loss, "grad_norm": result.grad_norm}, out / "step.pt")

    cfg = compose_config(overrides)
    train(cfg, run_dir=out / "run", train_tokens=tokens, train_durations=durations, bpe_model=bpe)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
