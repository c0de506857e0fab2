// `#[checkpoint]` on both body forms, methods and generic element types, under deny(warnings).
#![deny(warnings)]

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Element, Policy};

struct Model<T: Element> {
    scales: Vec<T>,
}

impl<T: Element> Model<T> {
    #[checkpoint(every = 2, precision = "bf16", replay = "layer")]
    fn forward<'a>(&self, ckpt: &mut Checkpointer<T>, x: Tensor<'a, T>) -> Tensor<'a, T> {
        let mut x = x;
        for scale in &self.scales {
            x = (x * *scale).tanh();
        }
        x
    }
}

#[checkpoint(policy = "sqrt", max = 8)]
fn sequence<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    let x = x.relu();
    let x = x.exp();
    let x = &x + 1.0;
    x
}

pub(crate) fn main() {
    let model = Model {
        scales: vec![0.5f64; 6],
    };
    let mut ckpt = Checkpointer::for_element(CheckpointConfig::new(Policy::Sqrt));
    tensorscope::scope(|s| {
        let y = model.forward(&mut ckpt, s.ones::<f64>(&[3]));
        assert_eq!(y.shape(), &[3]);
        assert_eq!(sequence(&s.zeros::<f32>(&[2])).to_vec(), vec![2.0; 2]);
    });
    assert_eq!(ckpt.stored_layers(), vec![0, 2, 4]);
    tensorscope::scope(|s| {
        let one = model.layer(&s.zeros::<f64>(&[3]), 5);
        assert_eq!(one.to_vec(), vec![0.0; 3]);
    });
}
