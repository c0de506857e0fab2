//! A gradient check: analytic gradients against central finite differences, in f64.

use ndarray::{ArrayD, Dimension};

use crate::autograd::Gradients;
use crate::error::{Error, Result, Shape};
use crate::pool::Pool;
use crate::tensor::Tensor;

/// What [`check_gradients`] measured: per input, the largest difference between the analytic and
/// the numeric gradient, as `|analytic - numeric| / (1 + |numeric|)` (absolute for small gradients,
/// relative for large ones), and where it was.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GradCheck {
    /// Per input, the largest error over its elements.
    pub errors: Vec<f64>,
    /// Per input, the index of that element.
    pub worst: Vec<Vec<usize>>,
    /// Per input, the analytic gradient.
    pub analytic: Vec<ArrayD<f64>>,
    /// Per input, the numeric gradient.
    pub numeric: Vec<ArrayD<f64>>,
}

impl GradCheck {
    /// The largest error over every input (0 for no input); NaN if any error is NaN (a NaN
    /// gradient is never a pass).
    pub fn max_error(&self) -> f64 {
        self.errors.iter().copied().fold(0.0, |worst, e| {
            if e.is_nan() || worst.is_nan() {
                f64::NAN
            } else {
                worst.max(e)
            }
        })
    }
}

/// Checks the gradient of `f`, a function of tensors that returns one value, at `inputs`: the
/// gradient [`Tensor::backward`] computes against central finite differences with step `step`
/// (`(f(x + h) - f(x - h)) / 2h` for every element in turn), everything in `f64`.
///
/// `f` is called once with its inputs marked [`Tensor::requires_grad`], then twice per input
/// element; each call runs in a scope of its own on `pool`. An input the result does not depend on
/// has an analytic gradient of zeros. Fails with the first error of `f` or of `backward` (for
/// instance [`Error::NotDifferentiable`]), and with [`Error::BackwardNeedsScalar`] if `f` returns
/// more than one value.
///
/// ```
/// use tensorscope::autograd::check_gradients;
/// use tensorscope::{Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let x = ndarray::arr2(&[[0.3, -1.2], [2.0, 0.7]]).into_dyn();
/// let check = check_gradients(&pool, &[x], 1e-6, |xs| {
///     (&xs[0]).tanh().try_sum(1)?.try_mse(&xs[0].try_sum(1)?)
/// })
/// .unwrap();
/// assert!(check.max_error() < 1e-8, "{check:?}");
/// ```
pub fn check_gradients(
    pool: &Pool,
    inputs: &[ArrayD<f64>],
    step: f64,
    f: impl for<'s> Fn(&[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>>,
) -> Result<GradCheck> {
    let analytic = pool.scope(|s| {
        let xs = inputs
            .iter()
            .map(|a| s.try_tensor(a).map(Tensor::requires_grad))
            .collect::<Result<Vec<_>>>()?;
        let y = f(&xs)?;
        // A result that depends on no input has no graph: every gradient is zero.
        let grads = match y.backward() {
            Err(Error::NoGraph) if y.len() == 1 => Gradients::new(s),
            other => other?,
        };
        Ok::<_, Error>(
            xs.iter()
                .map(|x| match grads.of(x) {
                    Some(g) => g.to_array(),
                    None => ArrayD::zeros(x.shape()),
                })
                .collect::<Vec<_>>(),
        )
    })?;
    let value_at = |xs: &[ArrayD<f64>]| -> Result<f64> {
        pool.scope(|s| {
            let xs = xs
                .iter()
                .map(|a| s.try_tensor(a))
                .collect::<Result<Vec<_>>>()?;
            let y = f(&xs)?;
            match y.to_vec()[..] {
                [v] => Ok(v),
                _ => Err(Error::BackwardNeedsScalar {
                    shape: Shape::from(y.shape()),
                }),
            }
        })
    };
    let mut check = GradCheck {
        errors: Vec::new(),
        worst: Vec::new(),
        analytic,
        numeric: Vec::new(),
    };
    let mut moved = inputs.to_vec();
    for (i, input) in inputs.iter().enumerate() {
        let mut numeric = ArrayD::zeros(input.shape());
        let (mut error, mut worst) = (0.0f64, vec![0; input.ndim()]);
        for (index, &v) in input.indexed_iter() {
            moved[i][&index] = v + step;
            let plus = value_at(&moved)?;
            moved[i][&index] = v - step;
            let minus = value_at(&moved)?;
            moved[i][&index] = v;
            let n = (plus - minus) / (2.0 * step);
            numeric[&index] = n;
            let e = (check.analytic[i][&index] - n).abs() / (1.0 + n.abs());
            if e > error || e.is_nan() {
                error = e;
                worst = index.slice().to_vec();
            }
        }
        check.errors.push(error);
        check.worst.push(worst);
        check.numeric.push(numeric);
    }
    Ok(check)
}
