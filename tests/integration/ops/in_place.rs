//! Buffer reuse: a by-value op on a tensor no one else holds writes its result into that tensor's
//! buffer (renting nothing), a binary op reuses whichever owned operand has the output's shape, and
//! an op on a tensor with a live clone or alias rents and leaves the other handle intact.

use ndarray::ArrayD;
use tensorscope::{Tensor, TensorOps};

use super::{
    assert_close, assert_close_tol, gelu_ref, layer_norm_ref, sigmoid_ref, softmax_ref, to_f64,
};
use crate::common::test_pool;

#[test]
fn by_value_ops_on_a_unique_tensor_write_into_its_own_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[4, 8], 80);
        let mut want = to_f64(&x);
        let ptr = x.as_slice().unwrap().as_ptr();
        let before = pool.stats();
        let rented = s.stats().rented;

        macro_rules! step {
            ($x:ident = $op:expr, $f:expr) => {
                let $x = $op;
                want = $f(want);
                assert_eq!(
                    $x.as_slice().unwrap().as_ptr(),
                    ptr,
                    "{} moved",
                    stringify!($op)
                );
            };
        }
        step!(x = x.relu(), |w: ArrayD<f64>| w.mapv(|v| v.max(0.0)));
        step!(x = x * 2.0, |w: ArrayD<f64>| w * 2.0);
        step!(x = x - 0.5, |w: ArrayD<f64>| w - 0.5);
        step!(x = 3.0f32 * x, |w: ArrayD<f64>| w * 3.0);
        step!(x = -x, |w: ArrayD<f64>| -w);
        step!(x = x.gelu(), |w: ArrayD<f64>| w.mapv(gelu_ref));
        step!(x = x.silu(), |w: ArrayD<f64>| w
            .mapv(|v| v * sigmoid_ref(v)));
        step!(x = x.tanh(), |w: ArrayD<f64>| w.mapv(f64::tanh));
        step!(x = x.sigmoid(), |w: ArrayD<f64>| w.mapv(sigmoid_ref));
        step!(x = x.exp(), |w: ArrayD<f64>| w.mapv(f64::exp));
        step!(x = x.map(|v| v * v), |w: ArrayD<f64>| w.mapv(|v| v * v));
        step!(x = x.layer_norm(1e-5), |w: ArrayD<f64>| layer_norm_ref(
            &w, 1e-5
        ));
        step!(x = x.softmax(0), |w: ArrayD<f64>| softmax_ref(&w, 0, false));
        step!(x = x.log_softmax(1), |w: ArrayD<f64>| softmax_ref(
            &w, 1, true
        ));

        let after = pool.stats();
        assert_eq!(after.misses, before.misses, "no new allocation");
        assert_eq!(
            after.hits, before.hits,
            "no rent served from the cache either"
        );
        assert_eq!(s.stats().rented, rented, "nothing rented");
        assert_close_tol("chain of in-place ops", &x, &want, 1e-4, 1e-5);
    });
}

#[test]
fn by_value_op_on_a_tensor_with_a_live_clone_rents_and_leaves_the_clone_intact() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let b = s.randn::<f32>(&[3], 81);
        let x = s.randn::<f32>(&[2, 3], 82);
        let original = x.to_array();

        // Each op consumes one handle while `keep` stays alive.
        let check =
            |what: &str, keep: &Tensor<'_, f32>, y: &Tensor<'_, f32>, rented_before: u64| {
                assert_ne!(
                    y.as_slice().unwrap().as_ptr(),
                    keep.as_slice().unwrap().as_ptr(),
                    "{what}: same buffer"
                );
                assert!(!y.shares_buffer_with(keep), "{what}");
                assert_eq!(keep.to_array(), original, "{what}: the clone changed");
                assert_eq!(s.stats().rented, rented_before + 1, "{what}: one new rent");
            };

        let keep = x.clone();
        let r = s.stats().rented;
        let y = x.clone().relu();
        check("relu", &keep, &y, r);
        assert_close("relu values", &y, &original.mapv(|v| v.max(0.0)));

        let r = s.stats().rented;
        let y = x.clone() * 2.0;
        check("* 2", &keep, &y, r);
        assert_close("* 2 values", &y, &(&original * 2.0));

        let r = s.stats().rented;
        let y = x.clone().softmax(1);
        check("softmax", &keep, &y, r);
        assert_close(
            "softmax values",
            &y,
            &softmax_ref(&original.mapv(f64::from), 1, false),
        );

        let r = s.stats().rented;
        let y = x.clone() + &b;
        check("+ &b", &keep, &y, r);
        assert_close("+ &b values", &y, &(&original + &b.to_array()));

        // A reshape is an alias too.
        let view = x.reshape(&[3, 2]);
        let r = s.stats().rented;
        let y = x.exp();
        check("exp with a reshaped alias", &view.reshape(&[2, 3]), &y, r);
        assert_close("exp values", &y, &original.mapv(f32::exp));
    });
}

#[test]
fn owned_lhs_with_borrowed_rhs_reuses_the_lhs_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let b = s.randn::<f32>(&[3], 83);
        for rhs_shape in [&[2usize, 3][..], &[3], &[1]] {
            let b = if rhs_shape == [3] {
                b.clone()
            } else {
                s.uniform::<f32>(rhs_shape, 0.5, 2.0, 84)
            };
            let a = s.randn::<f32>(&[2, 3], 85);
            let want = &a.to_array() - &b.to_array();
            let ptr = a.as_slice().unwrap().as_ptr();
            let before = pool.stats();
            let y = a - &b;
            assert_eq!(
                y.as_slice().unwrap().as_ptr(),
                ptr,
                "a - &b with b {rhs_shape:?}"
            );
            assert_eq!(pool.stats().misses, before.misses);
            assert_eq!(pool.stats().hits, before.hits);
            assert_close("a - &b values", &y, &want);
        }
        // Both owned and unique with the output shape: the left one is written.
        let a = s.randn::<f32>(&[2, 3], 86);
        let c = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 87);
        let want = &a.to_array() / &c.to_array();
        let ptr = a.as_slice().unwrap().as_ptr();
        let y = a / c;
        assert_eq!(y.as_slice().unwrap().as_ptr(), ptr);
        assert_close("a / c values", &y, &want);
    });
}

#[test]
fn borrowed_lhs_with_owned_rhs_reuses_the_rhs_buffer_when_it_has_the_output_shape() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Non-commutative ops, so a swapped argument order would show.
        for lhs_shape in [&[2usize, 3][..], &[3], &[2, 1]] {
            let a = s.randn::<f32>(lhs_shape, 88);
            let b = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 89);
            let (aa, ba) = (a.to_array(), b.to_array());
            let ptr = b.as_slice().unwrap().as_ptr();
            let before = pool.stats();
            let y = &a - b;
            assert_eq!(
                y.as_slice().unwrap().as_ptr(),
                ptr,
                "&a - b with a {lhs_shape:?}"
            );
            assert_eq!(pool.stats().misses, before.misses);
            assert_eq!(pool.stats().hits, before.hits);
            assert_close("&a - b values", &y, &(&aa - &ba));

            // Both owned: the lhs is written if it has the output shape, else the rhs.
            let a = s.randn::<f32>(lhs_shape, 88);
            let b = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 89);
            let ptr = if lhs_shape == [2, 3] {
                a.as_slice().unwrap().as_ptr()
            } else {
                b.as_slice().unwrap().as_ptr()
            };
            let y = a / b;
            assert_eq!(
                y.as_slice().unwrap().as_ptr(),
                ptr,
                "a / b with a {lhs_shape:?}"
            );
            assert_close("a / b values", &y, &(&aa / &ba));
        }
    });
}

#[test]
fn borrowed_lhs_with_owned_rhs_that_must_broadcast_rents_a_new_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[2, 3], 90);
        let b = s.uniform::<f32>(&[3], 0.5, 2.0, 91);
        let want = &a.to_array() / &b.to_array();
        let (pa, pb) = (
            a.as_slice().unwrap().as_ptr(),
            b.as_slice().unwrap().as_ptr(),
        );
        let rented = s.stats().rented;
        let y = &a / b;
        assert_eq!(s.stats().rented, rented + 1);
        assert_ne!(y.as_slice().unwrap().as_ptr(), pa);
        assert_ne!(y.as_slice().unwrap().as_ptr(), pb);
        assert_close("&a / b values", &y, &want);
        assert_eq!(a.to_array(), s.randn::<f32>(&[2, 3], 90).to_array());
    });
}
