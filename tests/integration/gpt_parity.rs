//! The GPT example's model (`examples/common/gpt.rs`) against PyTorch: the committed fixture
//! `tests/fixtures/gpt_tiny.safetensors` holds a tiny GPT-2-style model's weights, a batch of token
//! ids, and PyTorch's logits, loss, gradients of a few parameters and greedy tokens for them.
//! Regenerate it with `scripts/gpt_fixture.py` (see its header; CI never runs Python).

use std::path::PathBuf;

use tensorscope::nn::{generate, GenerateOptions, SafeTensorsFile};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

use crate::common::max_abs_diff;
use crate::gpt::{is_linear_weight, Config, Gpt};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt_tiny.safetensors")
}

/// The parameters whose gradients the fixture holds.
const GRADIENTS: [&str; 8] = [
    "wte",
    "wpe",
    "h.0.attn.c_attn.weight",
    "h.0.attn.c_attn.bias",
    "h.1.mlp.c_fc.weight",
    "h.1.ln_2.weight",
    "ln_f.weight",
    "ln_f.bias",
];

#[test]
fn logits_loss_and_gradients_match_pytorch() {
    let pool = Pool::with_max_memory_mb(256);
    let model = Gpt::load(&pool, &fixture(), Config::TINY).unwrap();
    let file = SafeTensorsFile::open(fixture()).unwrap();
    let ids = file.param::<i64>(&pool, "input_ids").unwrap();
    let want_logits = file.param::<f32>(&pool, "logits").unwrap();
    let want_loss = file.param::<f32>(&pool, "loss").unwrap();
    pool.scope(|s| {
        s.train(|t| {
            let ids = t.bind(&ids);
            let logits = model.forward(&ids);
            assert_eq!(logits.shape(), want_logits.shape());
            let logit_error = max_abs_diff(logits.as_slice().unwrap(), want_logits.as_slice());
            assert!(logit_error <= 1e-4, "max |logit error| {logit_error:e}");

            let loss = Gpt::loss(&logits, &ids);
            let loss_error = (loss.item() - want_loss.as_slice()[0]).abs();
            assert!(
                loss_error <= 1e-5,
                "loss {} vs {:?}",
                loss.item(),
                want_loss.as_slice()
            );

            let grads = loss.backward().unwrap();
            for name in GRADIENTS {
                let param = model.param(name).unwrap();
                let got = grads
                    .get(&param)
                    .unwrap_or_else(|| panic!("no gradient for {name}"));
                let want = file.param::<f32>(&pool, &format!("grad.{name}")).unwrap();
                // Linear weights are [out, in] in PyTorch, [in, out] here.
                let want = if is_linear_weight(name) {
                    t.bind(&want).t().to_vec()
                } else {
                    want.as_slice().to_vec()
                };
                let largest = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
                let error = max_abs_diff(got.as_slice().unwrap(), &want) / largest;
                assert!(
                    error <= 1e-4,
                    "{name}: gradient error {error:e} relative to its largest {largest:e}"
                );
            }
        })
    });
}

#[test]
fn the_checkpointed_forward_gives_the_plain_logits_and_gradients_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(256);
    let model = Gpt::load(&pool, &fixture(), Config::TINY).unwrap();
    let ids = SafeTensorsFile::open(fixture())
        .unwrap()
        .param::<i64>(&pool, "input_ids")
        .unwrap();
    // (logits, every listed gradient) of one training forward and backward.
    let run = |ckpt: Option<&mut Checkpointer>| {
        pool.scope(|s| {
            s.train(|t| {
                let ids = t.bind(&ids);
                let logits = match ckpt {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let grads = Gpt::loss(&logits, &ids).backward().unwrap();
                let grads: Vec<Vec<f32>> = GRADIENTS
                    .iter()
                    .map(|n| grads.get(&model.param(n).unwrap()).unwrap().to_vec())
                    .collect();
                (logits.to_vec(), grads)
            })
        })
    };
    let plain = run(None);
    for policy in [Policy::Every(1), Policy::Sqrt] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        assert!(run(Some(&mut ckpt)) == plain, "{policy:?}");
    }
}

#[test]
fn greedy_generation_gives_pytorchs_tokens() {
    let pool = Pool::with_max_memory_mb(64);
    let model = Gpt::load(&pool, &fixture(), Config::TINY).unwrap();
    let file = SafeTensorsFile::open(fixture()).unwrap();
    let want = file.param::<i64>(&pool, "generated").unwrap();
    let tokens = model.generate(&pool, &want.as_slice()[..4], 8);
    assert_eq!(tokens, want.as_slice());
    // Through the key/value cache: the same tokens, alone and beside a longer prompt.
    let (prompt, new) = want.as_slice().split_at(4);
    let options = GenerateOptions::greedy(8);
    let cached = pool
        .scope(|s| generate(&model, s, &[prompt], &options))
        .unwrap();
    assert_eq!(cached.tokens, [new]);
    let batch = pool
        .scope(|s| generate(&model, s, &[prompt, &want.as_slice()[..7]], &options))
        .unwrap();
    assert_eq!(batch.tokens[0], new);
    assert_eq!(
        batch.tokens[1],
        model.generate(&pool, &want.as_slice()[..7], 8)[7..]
    );
}
