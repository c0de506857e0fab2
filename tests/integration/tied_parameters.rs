//! Tied parameters: a model whose two fields hold one `Param` (the GPT's LM head tied to its token
//! embedding by `Gpt::tie_head`, as GPT-2 ties them) trains, counts, saves and loads as the same
//! model with the tie done by hand (one field read in both places).

use tensorscope::nn::{
    Adam, LoadOptions, NnError, Optimizer, SafeTensorsError, SafeTensorsFile, SaveOptions,
};
use tensorscope::prelude::*;

use crate::gpt::{Config, Gpt};

const TOKENS: [i64; 16] = [3, 10, 17, 24, 31, 38, 45, 52, 59, 66, 73, 80, 87, 94, 5, 12];

/// The loss of one AdamW step of `model` on [`TOKENS`], before the step.
fn step(pool: &Pool, model: &mut Gpt, adam: &mut Adam) -> f32 {
    pool.train(|t| {
        let ids = t.from_slice::<i64>(&[2, 8], &TOKENS);
        let loss = Gpt::loss(&model.forward(&ids), &ids);
        let value = loss.item();
        let grads = loss.backward().unwrap();
        adam.step(model, &grads).unwrap();
        value
    })
}

fn values(model: &Gpt) -> Vec<(String, Vec<f32>)> {
    let mut all = Vec::new();
    model.visit_params(&ParamPath::ROOT, &mut |path, p| {
        all.push((path.to_string(), p.to_vec()))
    });
    all
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "tensorscope-{name}-{}.safetensors",
        std::process::id()
    ))
}

#[test]
fn a_tied_head_trains_bit_for_bit_as_the_tie_by_hand() {
    let pool = Pool::with_max_memory_mb(64);
    let mut by_hand = Gpt::random(&pool, Config::TINY, 1).unwrap();
    let mut tied = Gpt::random(&pool, Config::TINY, 1).unwrap().tie_head();
    assert_eq!(tied.param_count(), by_hand.param_count(), "counted once");
    let names: Vec<String> = tied.named_params().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"wte".to_string()) && !names.contains(&"lm_head.weight".to_string()),
        "the first name wins: {names:?}"
    );
    let (mut adam_hand, mut adam_tied) = (Adam::adamw(1e-2, 0.01), Adam::adamw(1e-2, 0.01));
    let mut losses = Vec::new();
    for _ in 0..5 {
        let hand = step(&pool, &mut by_hand, &mut adam_hand);
        let tie = step(&pool, &mut tied, &mut adam_tied);
        assert_eq!(hand.to_bits(), tie.to_bits(), "the same loss");
        losses.push(tie);
    }
    assert!(
        losses[4] < losses[0] - 0.05,
        "the loss goes down: {losses:?}"
    );
    let head = tied.param("lm_head.weight").unwrap();
    let wte = tied.param("wte").unwrap();
    assert!(head.shares_buffer_with(&wte), "still one parameter's data");
    let hand = values(&by_hand);
    let mut tied_values = values(&tied);
    let head_values = tied_values.pop().expect("lm_head.weight, walked last");
    assert_eq!(head_values.0, "lm_head.weight");
    assert_eq!(tied_values, hand, "every parameter bit for bit");
    assert_eq!(
        head_values.1, hand[0].1,
        "the head holds the trained embedding"
    );
}

#[test]
fn a_tied_model_saves_both_names_and_loads_keeping_the_tie() {
    let pool = Pool::with_max_memory_mb(64);
    let path = temp("tied-gpt");
    let mut saved = Gpt::random(&pool, Config::TINY, 3).unwrap().tie_head();
    let mut adam = Adam::new(1e-2);
    step(&pool, &mut saved, &mut adam);
    saved.save_safetensors(&path, &SaveOptions::new()).unwrap();
    let file = SafeTensorsFile::open(&path).unwrap();
    assert!(
        file.contains("wte") && file.contains("lm_head.weight"),
        "{file:?}"
    );
    let wte = saved.param("wte").unwrap();
    assert_eq!(
        file.param::<f32>(&pool, "lm_head.weight").unwrap().to_vec(),
        wte.to_vec()
    );
    drop(file);

    let mut loaded = Gpt::random(&pool, Config::TINY, 4).unwrap().tie_head();
    loaded.load_safetensors(&path, &LoadOptions::new()).unwrap();
    assert_eq!(values(&loaded), values(&saved), "every name's values");
    let (head, wte) = (
        loaded.param("lm_head.weight").unwrap(),
        loaded.param("wte").unwrap(),
    );
    assert!(head.shares_buffer_with(&wte), "the load keeps the tie");
    drop((head, wte));
    // Trained on from there, the loaded model and the saved one stay equal (one optimizer's
    // state moved with a save and load of its own).
    let state = temp("tied-gpt-adam");
    adam.save_state(&saved, &state).unwrap();
    let mut resumed = Adam::new(1e-2);
    resumed.load_state(&loaded, &state).unwrap();
    assert_eq!(
        SafeTensorsFile::open(&state).unwrap().names().len(),
        2 * saved.named_params().len(),
        "the tied parameter's state once: two moments of each parameter"
    );
    step(&pool, &mut saved, &mut adam);
    step(&pool, &mut loaded, &mut resumed);
    assert_eq!(values(&loaded), values(&saved));
    std::fs::remove_file(&state).unwrap();

    // A file whose two names of the tied parameter differ is refused, naming both.
    let untied = Gpt::random(&pool, Config::TINY, 5).unwrap();
    untied.save_safetensors(&path, &SaveOptions::new()).unwrap();
    let mut other = Gpt::random(&pool, Config::TINY, 6).unwrap();
    other.load_safetensors(&path, &LoadOptions::new()).unwrap();
    // `other` holds the file's values; a file with an `lm_head.weight` of other values:
    let mut with_head =
        tensorscope::nn::ParamStore::<f32>::from_safetensors(&pool, &path, &LoadOptions::new())
            .unwrap();
    let mut head = with_head.get("wte").unwrap().duplicate();
    head.view_mut()[[2, 1]] = 0.5;
    with_head.add("lm_head.weight", head).unwrap();
    with_head
        .save_safetensors(&path, &SaveOptions::new())
        .unwrap();
    let before = values(&loaded);
    let err = loaded
        .load_safetensors(&path, &LoadOptions::new())
        .unwrap_err();
    assert!(
        matches!(
            &err,
            NnError::SafeTensors(SafeTensorsError::TiedTensorsDiffer { name, first, index, value, .. })
                if name == "lm_head.weight" && first == "wte" && *index == 2 * 32 + 1 && *value == 0.5
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("\"wte\" and \"lm_head.weight\""),
        "{err}"
    );
    assert_eq!(values(&loaded), before, "a refused load changes nothing");
    // A file that holds the parameter under its first name only loads, the tie kept.
    other.save_safetensors(&path, &SaveOptions::new()).unwrap();
    loaded.load_safetensors(&path, &LoadOptions::new()).unwrap();
    let (head, wte) = (
        loaded.param("lm_head.weight").unwrap(),
        loaded.param("wte").unwrap(),
    );
    assert!(head.shares_buffer_with(&wte) && wte.to_vec() == other.param("wte").unwrap().to_vec());
    std::fs::remove_file(&path).unwrap();
}
