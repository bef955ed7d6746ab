//! Dtype conversion with Rust `as` semantics, for `Cast`, `Fill` and `Arange`.
//!
//! Float → int truncates toward zero and saturates (NaN → 0); int → narrower int wraps;
//! anything → bool is `!= 0` (so NaN → true); bool → number is 0 or 1. Conversions to f16/bf16
//! go through f64, which is exact for every source except i64 beyond 2^53 (the reference does the
//! same).

use half::{bf16, f16};

use crate::elem::{Bool8, Pod};

/// A source of a conversion: how this dtype turns into each kind of destination.
pub trait CastSource: Pod {
    /// As f64 (`as f64`).
    fn as_f64(self) -> f64;
    /// As f32 (`as f32`, rounded once).
    fn as_f32(self) -> f32;
    /// As i64 (`as i64`).
    fn as_i64(self) -> i64;
    /// As i32 (`as i32`: saturating from floats, wrapping from wider ints).
    fn as_i32(self) -> i32;
    /// As u8 (`as u8`).
    fn as_u8(self) -> u8;
    /// `self != 0`.
    fn is_nonzero(self) -> bool;
}

macro_rules! float_source {
    ($t:ty, $to_f64:expr, $to_f32:expr) => {
        impl CastSource for $t {
            #[inline(always)]
            fn as_f64(self) -> f64 {
                ($to_f64)(self)
            }
            #[inline(always)]
            fn as_f32(self) -> f32 {
                ($to_f32)(self)
            }
            #[inline(always)]
            fn as_i64(self) -> i64 {
                self.as_f64() as i64
            }
            #[inline(always)]
            fn as_i32(self) -> i32 {
                self.as_f64() as i32
            }
            #[inline(always)]
            fn as_u8(self) -> u8 {
                self.as_f64() as u8
            }
            #[inline(always)]
            fn is_nonzero(self) -> bool {
                self.as_f64() != 0.0
            }
        }
    };
}

float_source!(f32, |x: f32| x as f64, |x: f32| x);
float_source!(f64, |x: f64| x, |x: f64| x as f32);
float_source!(f16, |x: f16| x.to_f64(), |x: f16| x.to_f32());
float_source!(bf16, |x: bf16| x.to_f64(), |x: bf16| x.to_f32());

macro_rules! int_source {
    ($t:ty) => {
        impl CastSource for $t {
            #[inline(always)]
            fn as_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn as_f32(self) -> f32 {
                self as f32
            }
            #[inline(always)]
            fn as_i64(self) -> i64 {
                self as i64
            }
            #[inline(always)]
            fn as_i32(self) -> i32 {
                self as i32
            }
            #[inline(always)]
            fn as_u8(self) -> u8 {
                self as u8
            }
            #[inline(always)]
            fn is_nonzero(self) -> bool {
                self != 0
            }
        }
    };
}

int_source!(i32);
int_source!(i64);
int_source!(u8);

impl CastSource for Bool8 {
    #[inline(always)]
    fn as_f64(self) -> f64 {
        self.get() as u8 as f64
    }
    #[inline(always)]
    fn as_f32(self) -> f32 {
        self.get() as u8 as f32
    }
    #[inline(always)]
    fn as_i64(self) -> i64 {
        self.get() as i64
    }
    #[inline(always)]
    fn as_i32(self) -> i32 {
        self.get() as i32
    }
    #[inline(always)]
    fn as_u8(self) -> u8 {
        self.get() as u8
    }
    #[inline(always)]
    fn is_nonzero(self) -> bool {
        self.get()
    }
}

/// A destination of a conversion.
pub trait CastTarget: Pod {
    /// `source as Self`.
    fn cast_from<S: CastSource>(source: S) -> Self;
}

impl CastTarget for f32 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        s.as_f32()
    }
}
impl CastTarget for f64 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        s.as_f64()
    }
}
impl CastTarget for f16 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        f16::from_f64(s.as_f64())
    }
}
impl CastTarget for bf16 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        bf16::from_f64(s.as_f64())
    }
}
impl CastTarget for i32 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        s.as_i32()
    }
}
impl CastTarget for i64 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        s.as_i64()
    }
}
impl CastTarget for u8 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        s.as_u8()
    }
}
impl CastTarget for Bool8 {
    #[inline(always)]
    fn cast_from<S: CastSource>(s: S) -> Self {
        Bool8::new(s.is_nonzero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_follow_as() {
        assert_eq!(i32::cast_from(-2.7f32), -2);
        assert_eq!(i32::cast_from(f64::NAN), 0);
        assert_eq!(i32::cast_from(1e20f64), i32::MAX);
        assert_eq!(u8::cast_from(-1.0f32), 0);
        assert_eq!(u8::cast_from(300i32), 44);
        assert_eq!(i32::cast_from(i64::MAX), -1);
        assert_eq!(f32::cast_from(16_777_217i64), 16_777_216.0);
        assert!(Bool8::cast_from(f32::NAN).get());
        assert!(!Bool8::cast_from(0.0f64).get());
        assert_eq!(f64::cast_from(Bool8(5)), 1.0);
        assert_eq!(f16::cast_from(1e6f32), f16::INFINITY);
        assert_eq!(bf16::cast_from(3i32), bf16::from_f32(3.0));
        assert_eq!(i64::cast_from(f16::from_f32(-3.5)), -3);
    }
}
