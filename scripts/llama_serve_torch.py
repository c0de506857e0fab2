"""PyTorch eager serving throughput of the random Llama bench model, for comparison with
tensorscope's Llama serving path on the same weights.

Loads DIR (default /tmp/llama_bench: model.safetensors and config.json, written by
`scripts/llama_fixture.py --bench DIR`; 12 layers, width 768, 12 heads, 4 key/value heads,
MLP 2048, vocabulary 32000, untied, 124.7 M parameters) into `transformers.LlamaForCausalLM`,
float32, with attention `--attn` (default sdpa, PyTorch's fused `scaled_dot_product_attention` and
transformers' default; `--attn eager` for the written-out matmul/softmax), under
`torch.inference_mode()` on `--threads` threads. (At prompt 128 on 2 threads, sdpa and eager
measured within noise of each other: prefill ~1.0 s at batch 8, decode ~25 tok/s at batch 1.)

The machine may be shared: the per-round times are printed beside the medians, so a round slowed
by another process shows.

For each batch size of `--batch` (default 1 and 8): a prompt of `--prompt` random token ids
(default 128; torch.manual_seed(0); every sequence of the batch gets the SAME ids, so no padding
and no attention mask), then greedy decoding with the KV cache, by a hand-written loop over a
`DynamicCache` so that the two phases are timed apart with time.perf_counter:
  - prefill: one forward over the whole prompt, filling the cache, with logits for the last
    position only (`logits_to_keep=1`, as `generate` does), and the argmax giving the first new
    token; prefill tok/s = batch * prompt / time, and the time is the time to first token;
  - decode: `--new` (default 64) single-token forwards, each feeding the last token chosen and
    choosing the next by argmax; decode tok/s = batch * new / time.
So each round makes new + 1 tokens per sequence. One untimed warm-up (prefill and 4 decode steps)
per batch size, then `--rounds` (default 3) timed rounds; the table gives the median of each
measure. Before timing, the hand loop's tokens at batch 1 are checked against
`model.generate(do_sample=False, max_new_tokens=new + 1)`. Peak RSS is getrusage's ru_maxrss
at the end (the whole process: weights, caches, allocator).

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors transformers
  /tmp/venv/bin/python scripts/llama_fixture.py --bench /tmp/llama_bench
  /tmp/venv/bin/python scripts/llama_serve_torch.py [--dir /tmp/llama_bench] [--threads 2]
      [--batch 1 8] [--prompt 128] [--new 64] [--rounds 3] [--attn sdpa|eager]
"""
import argparse
import resource
import statistics
import time

import torch
import transformers
from transformers import DynamicCache, LlamaForCausalLM


def run(model, ids, n_new):
    """Prefill then n_new decode steps; returns (tokens [b, n_new + 1], prefill s, decode s)."""
    cache = DynamicCache(config=model.config)
    t0 = time.perf_counter()
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)                  # [b, 1]
    t1 = time.perf_counter()
    cache, toks = out.cache, [nxt]
    for _ in range(n_new):
        out = model(input_ids=nxt, cache=cache, use_cache=True)
        cache, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(nxt)
    t2 = time.perf_counter()
    return torch.cat(toks, 1), t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/llama_bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = LlamaForCausalLM.from_pretrained(args.dir, dtype=torch.float32,
                                             attn_implementation=args.attn).eval()
    model.generation_config.eos_token_id = None                       # never stop early
    model.generation_config.pad_token_id = None
    cfg = model.config
    torch.manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), dtype=torch.int64)

    rows = []
    with torch.inference_mode():
        toks, _, _ = run(model, prompt, args.new)
        ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=args.new + 1, min_new_tokens=args.new + 1,
                             use_cache=True)[:, args.prompt:]
        assert torch.equal(toks, ref), f"hand loop {toks.tolist()} != generate {ref.tolist()}"
        print(f"batch 1: the hand loop's {args.new + 1} tokens equal model.generate's greedy "
              f"tokens ({len(set(toks[0].tolist()))} distinct)")

        for b in args.batch:
            ids = prompt.expand(b, -1).contiguous()
            run(model, ids, 4)                                          # warm-up, untimed
            pre, dec = [], []
            for _ in range(args.rounds):
                toks_b, tp, td = run(model, ids, args.new)
                pre.append(tp)
                dec.append(td)
            same = sum(torch.equal(row, toks[0]) for row in toks_b)    # a note, not a check:
            # the rows are the same prompt, but another batch size may round differently
            tp, td = statistics.median(pre), statistics.median(dec)
            rows.append((b, b * args.prompt / tp, b * args.new / td, 1e3 * tp))
            print(f"  batch {b}: prefill {[f'{t:.3f}' for t in pre]} s, "
                  f"decode {[f'{t:.3f}' for t in dec]} s; {same}/{b} rows give batch 1's tokens",
                  flush=True)

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024          # KiB -> MiB
    print()
    print(f"PyTorch {torch.__version__} eager (transformers {transformers.__version__}, "
          f"attention {args.attn}), float32, {torch.get_num_threads()} threads; "
          f"prompt {args.prompt}, {args.new} decode steps, median of {args.rounds} rounds")
    print()
    print("| batch | prefill tok/s | decode tok/s | first token ms |")
    print("| ---: | ---: | ---: | ---: |")
    for b, p, d, ms in rows:
        print(f"| {b} | {p:.1f} | {d:.1f} | {ms:.1f} |")
    print()
    print(f"peak RSS: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
