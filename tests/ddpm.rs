//! The test a person applies to a diffusion model, made a check: digits drawn by the DDPM of
//! `examples/ddpm.rs` (its averaged weights after the example's default run, committed as
//! `tests/fixtures/ddpm_digits.safetensors`) look like digits to the digits example's classifier,
//! trained here on the real digits (sure of most of them, at least 90% of its probability on
//! one class), and the noise they were drawn from does not. The example's own run draws 64 with
//! each sampler; DDIM's 10 steps here keep the test's time down.

#[path = "../examples/common/ddpm_unet.rs"]
mod ddpm_unet;
#[path = "../examples/common/diffusion.rs"]
mod diffusion;
#[path = "../examples/common/digits_classifier.rs"]
mod digits_classifier;

use diffusion::{Diffusion, Sampler};
use tensorscope::nn::{LoadOptions, SafeTensorsFile};
use tensorscope::prelude::*;

const SAMPLES: usize = 24;
const SIDE: usize = 16;

#[test]
fn generated_digits_are_recognised_as_digits() {
    let pool = Pool::with_max_memory_mb(256);
    let data = SafeTensorsFile::open("examples/data/digits.safetensors").expect("the digits");
    let images = data.param::<f32>(&pool, "train.images").expect("images");
    let labels = data.param::<i64>(&pool, "train.labels").expect("labels");
    let classifier = digits_classifier::train(&pool, &images, &labels, 10, 0).expect("training");
    // The classifier itself: most held-out digits, with confidence.
    let test = data
        .param::<f32>(&pool, "test.images")
        .expect("held-out images");
    let held_out: Vec<f32> = test.as_slice().iter().map(|v| 2.0 * v - 1.0).collect();
    let n = test.shape()[0];
    let (sure, _) = digits_classifier::confident(&pool, &classifier, &held_out, n, 8, 0.9);
    println!("sure of {sure} of {n} held-out digits");
    assert!(
        sure * 5 >= n * 4,
        "the classifier is sure of only {sure} of {n} real digits"
    );

    let mut model = ddpm_unet::Unet::new(&pool, 1, 32, 0).expect("the UNet");
    let weights = "tests/fixtures/ddpm_digits.safetensors";
    model
        .load_safetensors(weights, &LoadOptions::new())
        .expect("the DDPM's weights");
    let diffusion = Diffusion::linear(&pool, 1000);
    let shape = [SAMPLES, 1, SIDE, SIDE];
    let sampler = Sampler::Ddim { steps: 10 };
    let digits = diffusion
        .sample(&pool, &model, sampler, shape, 1, &mut |_| ())
        .expect("sampling");
    let (sure, counts) =
        digits_classifier::confident(&pool, &classifier, &digits, SAMPLES, SIDE, 0.9);
    println!("sure of {sure} of {SAMPLES} generated digits, by class {counts:?}");
    assert!(
        sure * 2 > SAMPLES,
        "the classifier is sure of only {sure} of {SAMPLES} generated digits ({counts:?} by class)"
    );
    assert!(
        counts.iter().filter(|&&c| c > 0).count() >= 5,
        "the generated digits are of few classes: {counts:?}"
    );

    // The control: the starting noise, clipped to the images' range, is not taken for digits.
    let noise = pool.scope(|s| s.randn::<f32>(&shape, 1).clamp(-1.0, 1.0).to_vec());
    let (sure, counts) =
        digits_classifier::confident(&pool, &classifier, &noise, SAMPLES, SIDE, 0.9);
    println!("sure of {sure} of {SAMPLES} noise images, by class {counts:?}");
    assert!(
        sure * 4 < SAMPLES,
        "the classifier is sure of {sure} of {SAMPLES} noise images ({counts:?}): it tells nothing"
    );
}
