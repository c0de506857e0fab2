//! The Llama-style decoder of `examples/common/llama.rs` against Hugging Face's `LlamaForCausalLM`
//! (`scripts/llama_fixture.py`: grouped-query attention, 4 heads on 2 key/value heads, untied
//! head): a plain forward's logits, the last decode step's logits through the key/value cache,
//! and greedy generation of three prompts of different lengths, one at a time and as one batch.

use std::path::PathBuf;

use tensorscope::nn::{generate, GenerateOptions, SafeTensorsFile, Sampling};
use tensorscope::prelude::*;

use crate::common::{max_abs_diff, test_pool};
use crate::llama::Llama;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_tiny.safetensors")
}

/// The model and the file's reference tensors.
fn load(pool: &Pool) -> (Llama, SafeTensorsFile) {
    Llama::open(pool, &fixture()).unwrap()
}

fn ids(file: &SafeTensorsFile, pool: &Pool, name: &str) -> Vec<i64> {
    file.param::<i64>(pool, name).unwrap().to_vec()
}

/// The fixture's three prompts and transformers' greedy tokens after each.
fn references(file: &SafeTensorsFile, pool: &Pool) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let all = |kind: &str| {
        (0..3)
            .map(|i| ids(file, pool, &format!("ref.{kind}.{i}")))
            .collect()
    };
    (all("prompt"), all("generated"))
}

#[test]
fn logits_match_hugging_face_within_1e_4() {
    let pool = test_pool(64);
    let (model, file) = load(&pool);
    let want = file.param::<f32>(&pool, "ref.logits").unwrap();
    let input = ids(&file, &pool, "ref.input_ids");
    pool.scope(|s| {
        let input = s.from_slice::<i64>(&[2, 12], &input);
        let logits = model.forward(s, &input).unwrap();
        assert_eq!(logits.shape(), want.shape());
        let diff = max_abs_diff(&logits.to_vec(), &want.to_vec());
        assert!(diff < 1e-4, "max |logits - PyTorch's| = {diff}");
    });
}

#[test]
fn greedy_tokens_through_the_cache_equal_hugging_faces() {
    let pool = test_pool(64);
    let (model, file) = load(&pool);
    let (prompts, want) = references(&file, &pool);
    let options = GenerateOptions::greedy(10);
    // One prompt at a time, then the three as one batch of different lengths.
    for (prompt, want) in prompts.iter().zip(&want) {
        let got = pool
            .scope(|s| generate(&model, s, &[prompt], &options))
            .unwrap();
        assert_eq!(&got.tokens[0], want);
    }
    let batch: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
    let got = pool
        .scope(|s| generate(&model, s, &batch, &options))
        .unwrap();
    assert_eq!(got.tokens, want);
    assert_eq!(
        got.steps, 9,
        "the first token comes from the prompt's forward"
    );
}

#[test]
fn the_last_decode_steps_logits_match_hugging_face_within_1e_4() {
    let pool = test_pool(64);
    let (model, file) = load(&pool);
    let prompt = ids(&file, &pool, "ref.prompt.0");
    let generated = ids(&file, &pool, "ref.generated.0");
    let want = file
        .param::<f32>(&pool, "ref.decode_logits")
        .unwrap()
        .to_vec();
    // Prompt, then every generated token but the last through the cache one at a time: the
    // logits of the last step are those that chose the last token.
    let tokens: Vec<i64> = prompt
        .iter()
        .chain(&generated[..generated.len() - 1])
        .copied()
        .collect();
    pool.scope(|s| {
        let layout = tensorscope::nn::CausalLm::cache_layout(&model);
        let mut caches: Vec<_> = (0..layout.layers)
            .map(|_| tensorscope::nn::KvCache::new(s, 1, layout.kv_heads, 32, layout.head_dim))
            .collect();
        let first = s.from_slice::<i64>(&[1, prompt.len()], &prompt);
        let mut logits = model_step(&model, s, &first, &mut caches);
        for &token in &tokens[prompt.len()..] {
            let id = s.from_slice::<i64>(&[1, 1], &[token]);
            logits = model_step(&model, s, &id, &mut caches);
        }
        assert_eq!(caches[0].len(0), tokens.len());
        let diff = max_abs_diff(&logits.to_vec(), &want);
        assert!(diff < 1e-4, "max |logits - PyTorch's| = {diff}");
    });
}

/// The logits of the last position of `ids` after what `caches` hold.
fn model_step<'a>(
    model: &Llama,
    s: &Scope<'a, '_>,
    ids: &Tensor<'a, i64>,
    caches: &mut [tensorscope::nn::KvCache<'a>],
) -> Tensor<'a> {
    tensorscope::nn::CausalLm::forward_cached(model, s, ids, caches, None, 1).unwrap()
}

#[test]
fn sampling_is_reproducible_from_its_seed_and_stops_at_a_stop_token() {
    let pool = test_pool(64);
    let (model, file) = load(&pool);
    let prompt = ids(&file, &pool, "ref.prompt.1");
    let sampled = |seed: u64, stop: Vec<i64>| {
        let options = GenerateOptions {
            max_new_tokens: 12,
            sampling: Sampling {
                temperature: 0.9,
                top_k: Some(20),
                top_p: Some(0.9),
                seed,
            },
            stop_tokens: stop,
        };
        pool.scope(|s| generate(&model, s, &[&prompt, &prompt[..3]], &options))
            .unwrap()
            .tokens
    };
    let (a, b, c) = (sampled(1, vec![]), sampled(1, vec![]), sampled(2, vec![]));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a
        .iter()
        .all(|t| t.len() == 12 && t.iter().all(|&id| (0..128).contains(&id))));
    // Stopping at the third token of the first sequence: it ends there, the other goes on unless
    // it draws the same token.
    let stop = a[0][2];
    let stopped = sampled(1, vec![stop]);
    let first_stop = a[0].iter().position(|&t| t == stop).unwrap();
    assert_eq!(stopped[0], a[0][..=first_stop]);
    let other = a[1].iter().position(|&t| t == stop).map_or(12, |i| i + 1);
    assert_eq!(stopped[1], a[1][..other]);
}

#[test]
fn bad_prompts_and_bad_files_are_errors_that_name_the_fault() {
    let pool = test_pool(64);
    let (model, _) = load(&pool);
    let err = |prompts: &[&[i64]], new: usize| {
        pool.scope(|s| generate(&model, s, prompts, &GenerateOptions::greedy(new)))
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[], 4).contains("no prompt"));
    assert!(err(&[&[1], &[]], 4).contains("prompt 1 is empty"));
    assert!(err(&[&[1; 60]], 8).contains("pass the model's 64 positions"));
    assert!(err(&[&[1]], usize::MAX).contains("pass the model's 64 positions"));
    let bad_sampling = GenerateOptions {
        sampling: Sampling {
            top_k: Some(0),
            ..Sampling::default()
        },
        ..GenerateOptions::greedy(4)
    };
    let rents = |p: &Pool| p.stats().hits + p.stats().misses;
    let before = rents(&pool);
    pool.scope(|s| {
        let e = generate(&model, s, &[&[1]], &bad_sampling).unwrap_err();
        assert!(e.to_string().contains("generate: invalid top_k"), "{e}");
    });
    assert_eq!(rents(&pool), before, "refused before renting its caches");
    let e = err(&[&[1, 500]], 4);
    assert!(e.contains("index 500 is out of range"), "{e}");
    let missing = Llama::load(&pool, &fixture().with_file_name("gpt_tiny.safetensors"));
    let e = missing.err().unwrap();
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn threads_serve_one_model_each_request_under_its_budget_and_one_failing_alone() {
    let pool = test_pool(64);
    let (model, file) = load(&pool);
    let weights = pool.stats().bytes_in_use;
    let model = std::sync::Arc::new(model);
    let (prompts, want) = references(&file, &pool);
    // Requests 0-2 are the fixture's prompts with room to spare; request 3's budget cannot hold
    // its caches (2 layers x 2 x [1, 2, 13, 16] f32).
    let budgets = [1 << 20, 1 << 20, 1 << 20, 2048];
    let results = std::thread::scope(|threads| {
        let handles: Vec<_> = budgets
            .iter()
            .enumerate()
            .map(|(i, &budget)| {
                let (model, prompt) = (std::sync::Arc::clone(&model), &prompts[i % 3]);
                let pool = &pool;
                threads.spawn(move || {
                    pool.scope_with_budget(budget, |s| {
                        generate(&*model, s, &[prompt], &GenerateOptions::greedy(10))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (i, result) in results[..3].iter().enumerate() {
        assert_eq!(result.as_ref().unwrap().tokens[0], want[i], "request {i}");
    }
    let err = results[3].as_ref().unwrap_err();
    assert!(
        matches!(
            err,
            tensorscope::Error::ScopeBudgetExceeded { limit: 2048, .. }
        ),
        "{err}"
    );
    // Every request gave back what it rented: the pool holds the weights alone.
    assert_eq!(pool.stats().bytes_in_use, weights);
}

#[test]
fn configs_the_model_does_not_implement_are_refused_and_a_tied_head_is_the_embedding() {
    use crate::llama::Config;
    let base = r#"{"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}"#;
    let with = |extra: &str| Config::from_json(&format!("{base}{extra}}}"));
    assert_eq!(with("").unwrap().rope_theta, 10_000.0);
    for (extra, says) in [
        (
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#,
            "`rope_scaling`",
        ),
        (r#", "attention_bias": true"#, "`attention_bias` is true"),
        (r#", "hidden_act": "gelu""#, "`hidden_act` is gelu"),
        (r#", "num_key_value_heads": 3"#, "does not divide evenly"),
    ] {
        let err = with(extra).unwrap_err();
        assert!(err.contains(says), "{extra}: {err}");
    }
    // A file without `lm_head.weight` whose config ties the head: the embedding serves as both.
    let pool = test_pool(64);
    let file = SafeTensorsFile::open(fixture()).unwrap();
    let mut store = tensorscope::nn::ParamStore::<f32>::new(&pool);
    for name in file.names().iter().filter(|n| n.starts_with("model.")) {
        store.add(name, file.param(&pool, name).unwrap()).unwrap();
    }
    let mut save = tensorscope::nn::SaveOptions::new().metadata("tie_word_embeddings", "true");
    for (key, value) in file.metadata() {
        if key != "tie_word_embeddings" {
            save = save.metadata(key.as_str(), value.as_str());
        }
    }
    let path = std::env::temp_dir().join(format!("llama_tied_{}.safetensors", std::process::id()));
    store.save_safetensors(&path, &save).unwrap();
    let tied = Llama::load(&pool, &path);
    std::fs::remove_file(&path).unwrap();
    let tied = tied.unwrap();
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[1, 3], &[5, 9, 2]);
        let logits = tied.forward(s, &ids).unwrap();
        assert_eq!(logits.shape(), &[1, 3, 128]);
        // The fixture's own head gives other logits: the tied model used the embedding.
        let untied = Llama::load(&pool, &fixture())
            .unwrap()
            .forward(s, &ids)
            .unwrap();
        assert!(max_abs_diff(&logits.to_vec(), &untied.to_vec()) > 1e-3);
    });
}
