//! Masks: comparisons giving `u8` masks (NaN compares false), causal triangles, `where_cond` and
//! `masked_fill`, by value; and masks or operands that do not broadcast.

use tensorscope::ops::Cmp;

use super::iota;
use crate::common::test_pool;

#[test]
fn comparisons_masks_and_triangles() {
    test_pool(16).scope(|s| {
        let x = s.from_slice::<f32>(&[2, 2], &[1.0, 2.0, f32::NAN, 4.0]);
        let row = s.from_slice::<f32>(&[2], &[1.0, 3.0]);
        assert_eq!(x.eq(&row).to_vec(), vec![1, 0, 0, 0]);
        assert_eq!(x.ne(&row).to_vec(), vec![0, 1, 1, 1]);
        assert_eq!(x.lt(&row).to_vec(), vec![0, 1, 0, 0]);
        assert_eq!(x.le(&row).to_vec(), vec![1, 1, 0, 0]);
        assert_eq!(x.gt(&row).to_vec(), vec![0, 0, 0, 1]);
        assert_eq!(x.ge(&row).to_vec(), vec![1, 0, 0, 1]);
        assert_eq!(x.cmp_scalar(Cmp::Ge, 2.0).to_vec(), vec![0, 1, 0, 1]);
        let pos = s.arange(0i64, 3, 1);
        let causal = pos.unsqueeze(1).ge(&pos.unsqueeze(0));
        assert_eq!(causal.to_vec(), vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
        assert_eq!(s.ones::<u8>(&[3, 3]).tril(0).to_vec(), causal.to_vec());
        assert_eq!(
            s.ones::<u8>(&[2, 3]).triu(1).to_vec(),
            vec![0, 1, 1, 0, 0, 1]
        );
        assert_eq!(
            iota(s, &[2, 2, 2]).tril(-1).to_vec(),
            [0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 6.0, 0.0]
        );

        let a = iota(s, &[2, 3]);
        let b = s.full::<f32>(&[1], -1.0);
        let mask = s.from_slice::<u8>(&[3], &[1, 0, 1]);
        assert_eq!(
            mask.where_cond(&a, &b).to_vec(),
            [0.0, -1.0, 2.0, 3.0, -1.0, 5.0]
        );
        assert_eq!(
            a.masked_fill(&mask, 9.0).to_vec(),
            [9.0, 1.0, 9.0, 9.0, 4.0, 9.0]
        );

        let err = a.try_masked_fill(&s.ones::<u8>(&[3, 3]), 0.0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "masked_fill: incompatible shapes [2, 3] and [3, 3]: cannot broadcast: axis 0 of the \
             result has lengths 2 and 3, neither is 1"
        );
        let err = a
            .try_masked_fill(&s.ones::<u8>(&[2, 2, 3]), 0.0)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "masked_fill: incompatible shapes [2, 3] and [2, 2, 3]: the mask must broadcast to \
             the tensor's shape"
        );
        let err = a.try_cmp(&s.zeros::<f32>(&[2]), Cmp::Lt).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cmp: incompatible shapes [2, 3] and [2]"),
            "{err}"
        );
        assert_eq!(
            iota(s, &[3]).try_tril(0).unwrap_err().to_string(),
            "tril: invalid shape [3]: needs at least two axes"
        );
    });
}
