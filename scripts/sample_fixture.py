"""Reference distributions for tensorscope's sample_logits: Hugging Face's generation warpers.

Random draws cannot be matched, so the fixture holds the distribution a draw follows: writes
tests/fixtures/sample.safetensors (float64, about 3 KiB) with, for each case `NAME`, the logits
`NAME.logits` [3, 10], the settings `NAME.config` ([temperature, top_k or 0 for none, top_p or 1
for none]) and the probabilities `NAME.probs` [3, 10] after transformers' TemperatureLogitsWarper,
TopKLogitsWarper and TopPLogitsWarper (their code, restated below in torch) and a softmax. The test
draws many ids per row and checks their frequencies against these, and that a token of
probability 0 is never drawn. Read by tests/integration/ops/sample.rs; CI never runs Python, the
fixture is committed.

Regenerate (from the repository root):
  /work/venv/bin/python scripts/sample_fixture.py
(any Python with torch, numpy and safetensors will do).
"""
import torch
from safetensors.torch import save_file


def warp(scores, temperature, top_k, top_p):
    """transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that order."""
    scores = scores / temperature
    if top_k:
        top_k = min(top_k, scores.size(-1))
        indices_to_remove = scores < torch.topk(scores, top_k)[0][..., -1, None]
        scores = scores.masked_fill(indices_to_remove, -float("inf"))
    if top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
        sorted_indices_to_remove[..., -1:] = 0  # min_tokens_to_keep = 1
        indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
        scores = scores.masked_fill(indices_to_remove, -float("inf"))
    return scores.softmax(dim=-1)


torch.manual_seed(0)
CASES = {  # name: (temperature, top_k, top_p)
    "temperature": (0.7, 0, 1.0),
    "top_k": (1.0, 3, 1.0),
    "top_p": (1.5, 0, 0.8),
    "top_k_top_p": (0.8, 5, 0.6),
}
out = {}
for name, (temperature, top_k, top_p) in CASES.items():
    logits = torch.randn(3, 10, dtype=torch.float64) * 2
    out[f"{name}.logits"] = logits
    out[f"{name}.config"] = torch.tensor([temperature, top_k, top_p], dtype=torch.float64)
    out[f"{name}.probs"] = warp(logits, temperature, top_k, top_p)
save_file(out, "tests/fixtures/sample.safetensors", metadata={"torch": torch.__version__})
