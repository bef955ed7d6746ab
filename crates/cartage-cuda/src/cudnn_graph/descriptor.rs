//! [`Descriptor`]: one owned `cudnnBackendDescriptor_t` (destroyed on drop) with typed setters
//! and getters for the attribute types the graphs use (convolution, matmul, pointwise,
//! reduction and reshape operations), and [`Failure`], the cuDNN status of a failed backend call
//! with what it was doing.
//!
//! Each setter passes cuDNN the attribute type its documentation names for that attribute
//! (`CUDNN_TYPE_INT64` arrays for sizes, `CUDNN_TYPE_DATA_TYPE`, `CUDNN_TYPE_BACKEND_DESCRIPTOR`
//! arrays for sub-descriptors, …) with a pointer to elements of the matching C type. Enum values
//! cuDNN writes back (numerical and behavior notes) are read as plain `u32`s, so a value this
//! build does not know is kept as a number rather than becoming an invalid Rust enum.

use std::ffi::{CStr, c_void};

use cartage_core::{Device, Error};
use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as Name;
use sys::cudnnBackendAttributeType_t as Type;

/// A failed cuDNN backend call: the call, the attribute or descriptor it was about, and
/// cuDNN's status.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    /// The cuDNN entry point, e.g. `cudnnBackendFinalize`.
    pub(crate) call: &'static str,
    /// What it was setting, reading or finalizing.
    pub(crate) what: String,
    /// cuDNN's status.
    pub(crate) status: sys::cudnnStatus_t,
}

impl Failure {
    /// A failure of `call` about `what` with cuDNN's `status`.
    pub(crate) fn new(call: &'static str, what: impl Into<String>, status: sys::cudnnStatus_t) -> Self {
        Failure {
            call,
            what: what.into(),
            status,
        }
    }

    /// Core's driver error for this failure in the op named `op` (`conv2d`, `attention`, …) on
    /// `device`: cuDNN's status name and words, the op and what was being done.
    pub(crate) fn error(&self, device: Device, op: &str) -> Error {
        Error::Driver {
            device,
            op: self.call,
            message: format!("{} (cuDNN graph API, {}: {})", status_text(self.status), op, self.what),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.call, self.what, status_text(self.status))
    }
}

/// cuDNN's name and words for `status`, e.g. `CUDNN_STATUS_NOT_SUPPORTED: …`.
pub(crate) fn status_text(status: sys::cudnnStatus_t) -> String {
    // SAFETY: `cudnnGetErrorString` returns a static NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(status)) };
    format!("{status:?}: {}", text.to_string_lossy())
}

/// The outcome of one backend call.
pub(crate) type Outcome<T> = std::result::Result<T, Failure>;

/// Turn a cuDNN status into an [`Outcome`] naming `call` and `what`.
pub(crate) fn check(status: sys::cudnnStatus_t, call: &'static str, what: impl FnOnce() -> String) -> Outcome<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Failure::new(call, what(), status))
    }
}

/// One owned backend descriptor of a known type.
pub(crate) struct Descriptor {
    raw: sys::cudnnBackendDescriptor_t,
    kind: sys::cudnnBackendDescriptorType_t,
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor (non-null, checked in `new`) and
        // destroyed once, here.
        let _ = unsafe { sys::cudnnBackendDestroyDescriptor(self.raw) };
    }
}

impl std::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind)
    }
}

impl Descriptor {
    /// A fresh descriptor of `kind` (not finalized).
    pub(crate) fn new(kind: sys::cudnnBackendDescriptorType_t) -> Outcome<Self> {
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `kind` is a descriptor type of this cuDNN.
        let status = unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) };
        check(status, "cudnnBackendCreateDescriptor", || format!("{kind:?}"))?;
        if raw.is_null() {
            return Err(Failure::new(
                "cudnnBackendCreateDescriptor",
                format!("{kind:?} came back null"),
                sys::cudnnStatus_t::CUDNN_STATUS_INTERNAL_ERROR,
            ));
        }
        Ok(Descriptor { raw, kind })
    }

    /// The raw handle, for `cudnnBackendExecute` and descriptor-valued attributes.
    pub(crate) fn raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.raw
    }

    /// Set `name` to `count` elements of type `ty` read from `elements`.
    ///
    /// # Safety
    /// `elements` points to `count` readable elements of the C type cuDNN documents for `ty`,
    /// valid for the call.
    unsafe fn set_raw(&self, name: Name, ty: Type, count: usize, elements: *const c_void) -> Outcome<()> {
        // SAFETY: a live descriptor; the elements are this function's contract.
        let status = unsafe { sys::cudnnBackendSetAttribute(self.raw, name, ty, count as i64, elements) };
        check(status, "cudnnBackendSetAttribute", || {
            format!("{name:?} of {:?}", self.kind)
        })
    }

    /// Set an `INT64` array attribute (sizes, strides, ids, one value as a one-element slice).
    pub(crate) fn set_i64s(&self, name: Name, values: &[i64]) -> Outcome<()> {
        // SAFETY: `values` holds `len` i64s, cuDNN's element type for CUDNN_TYPE_INT64.
        unsafe { self.set_raw(name, Type::CUDNN_TYPE_INT64, values.len(), values.as_ptr().cast()) }
    }

    /// Set a `DATA_TYPE` attribute.
    pub(crate) fn set_data_type(&self, name: Name, value: sys::cudnnDataType_t) -> Outcome<()> {
        // SAFETY: one `cudnnDataType_t` (a C enum, `repr(u32)` here), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_DATA_TYPE,
                1,
                (&value as *const sys::cudnnDataType_t).cast(),
            )
        }
    }

    /// Set a `BOOLEAN` attribute.
    pub(crate) fn set_bool(&self, name: Name, value: bool) -> Outcome<()> {
        // SAFETY: one C `bool` (Rust's `bool` has its size and values), alive for the call.
        unsafe { self.set_raw(name, Type::CUDNN_TYPE_BOOLEAN, 1, (&value as *const bool).cast()) }
    }

    /// Set a `FLOAT` attribute (the convolution operations' alpha and beta).
    pub(crate) fn set_f32(&self, name: Name, value: f32) -> Outcome<()> {
        // SAFETY: one C `float`, alive for the call.
        unsafe { self.set_raw(name, Type::CUDNN_TYPE_FLOAT, 1, (&value as *const f32).cast()) }
    }

    /// Set the `CONVOLUTION_MODE` attribute.
    pub(crate) fn set_conv_mode(&self, name: Name, value: sys::cudnnConvolutionMode_t) -> Outcome<()> {
        // SAFETY: one `cudnnConvolutionMode_t` (a C enum), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_CONVOLUTION_MODE,
                1,
                (&value as *const sys::cudnnConvolutionMode_t).cast(),
            )
        }
    }

    /// Set the `POINTWISE_MODE` attribute.
    pub(crate) fn set_pointwise_mode(&self, name: Name, value: sys::cudnnPointwiseMode_t) -> Outcome<()> {
        // SAFETY: one `cudnnPointwiseMode_t` (a C enum), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_POINTWISE_MODE,
                1,
                (&value as *const sys::cudnnPointwiseMode_t).cast(),
            )
        }
    }

    /// Set the `REDUCTION_OPERATOR_TYPE` attribute.
    pub(crate) fn set_reduction_op(&self, name: Name, value: sys::cudnnReduceTensorOp_t) -> Outcome<()> {
        // SAFETY: one `cudnnReduceTensorOp_t` (a C enum), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                1,
                (&value as *const sys::cudnnReduceTensorOp_t).cast(),
            )
        }
    }

    /// Set the `HEUR_MODE` attribute.
    pub(crate) fn set_heur_mode(&self, name: Name, value: sys::cudnnBackendHeurMode_t) -> Outcome<()> {
        // SAFETY: one `cudnnBackendHeurMode_t` (a C enum), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_HEUR_MODE,
                1,
                (&value as *const sys::cudnnBackendHeurMode_t).cast(),
            )
        }
    }

    /// Set a `HANDLE` attribute.
    pub(crate) fn set_handle(&self, name: Name, handle: sys::cudnnHandle_t) -> Outcome<()> {
        // SAFETY: one `cudnnHandle_t` (a pointer), alive for the call.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_HANDLE,
                1,
                (&handle as *const sys::cudnnHandle_t).cast(),
            )
        }
    }

    /// Set a `BACKEND_DESCRIPTOR` array attribute.
    pub(crate) fn set_descriptors(&self, name: Name, values: &[&Descriptor]) -> Outcome<()> {
        let raws: Vec<sys::cudnnBackendDescriptor_t> = values.iter().map(|d| d.raw).collect();
        // SAFETY: `raws` holds `len` live descriptor handles, cuDNN's element type for
        // CUDNN_TYPE_BACKEND_DESCRIPTOR.
        unsafe {
            self.set_raw(
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raws.len(),
                raws.as_ptr().cast(),
            )
        }
    }

    /// Set a `VOID_PTR` array attribute (device addresses).
    pub(crate) fn set_pointers(&self, name: Name, values: &[*mut c_void]) -> Outcome<()> {
        // SAFETY: `values` holds `len` pointers, cuDNN's element type for CUDNN_TYPE_VOID_PTR.
        unsafe { self.set_raw(name, Type::CUDNN_TYPE_VOID_PTR, values.len(), values.as_ptr().cast()) }
    }

    /// Finalize the descriptor (after every required attribute is set).
    pub(crate) fn finalize(&self) -> Outcome<()> {
        // SAFETY: a live descriptor.
        let status = unsafe { sys::cudnnBackendFinalize(self.raw) };
        check(status, "cudnnBackendFinalize", || format!("{:?}", self.kind))
    }

    /// Read one `INT64` attribute.
    pub(crate) fn get_i64(&self, name: Name) -> Outcome<i64> {
        let (mut value, mut count) = (0i64, 0i64);
        // SAFETY: a live descriptor; room for one i64 and a valid count out-pointer.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_INT64,
                1,
                &mut count,
                (&mut value as *mut i64).cast(),
            )
        };
        check(status, "cudnnBackendGetAttribute", || {
            format!("{name:?} of {:?}", self.kind)
        })?;
        Ok(value)
    }

    /// How many descriptors the `BACKEND_DESCRIPTOR` array attribute `name` holds.
    pub(crate) fn count_descriptors(&self, name: Name) -> Outcome<usize> {
        let mut count = 0i64;
        // SAFETY: a live descriptor; asking for no elements with a null array is cuDNN's way
        // to query the count alone.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                &mut count,
                std::ptr::null_mut(),
            )
        };
        check(status, "cudnnBackendGetAttribute", || {
            format!("the count of {name:?} of {:?}", self.kind)
        })?;
        Ok(count.max(0) as usize)
    }

    /// Read an enum-valued array attribute (`ty` one of cuDNN's enum attribute types) as raw
    /// `u32`s, at most `max` of them.
    pub(crate) fn get_enums(&self, name: Name, ty: Type, max: usize) -> Outcome<Vec<u32>> {
        let mut values = vec![0u32; max.max(1)];
        let mut count = 0i64;
        // SAFETY: a live descriptor; `values` has room for `max` C enums (`u32`-sized) and
        // `count` is a valid out-pointer.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(self.raw, name, ty, max as i64, &mut count, values.as_mut_ptr().cast())
        };
        check(status, "cudnnBackendGetAttribute", || {
            format!("{name:?} of {:?}", self.kind)
        })?;
        values.truncate((count.max(0) as usize).min(max));
        Ok(values)
    }

    /// Read a `BACKEND_DESCRIPTOR` array attribute into `wanted` fresh descriptors of `kind`
    /// (cuDNN fills descriptors the caller created); those cuDNN filled are returned.
    pub(crate) fn get_descriptors(
        &self,
        name: Name,
        kind: sys::cudnnBackendDescriptorType_t,
        wanted: usize,
    ) -> Outcome<Vec<Descriptor>> {
        if wanted == 0 {
            return Ok(Vec::new());
        }
        let mut owned = Vec::with_capacity(wanted);
        for _ in 0..wanted {
            owned.push(Descriptor::new(kind)?);
        }
        let mut raws: Vec<sys::cudnnBackendDescriptor_t> = owned.iter().map(|d| d.raw).collect();
        let mut count = 0i64;
        // SAFETY: a live descriptor; `raws` holds `wanted` live descriptors of the type cuDNN
        // fills for this attribute, and `count` is a valid out-pointer.
        let status = unsafe {
            sys::cudnnBackendGetAttribute(
                self.raw,
                name,
                Type::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                wanted as i64,
                &mut count,
                raws.as_mut_ptr().cast(),
            )
        };
        check(status, "cudnnBackendGetAttribute", || {
            format!("{name:?} of {:?}", self.kind)
        })?;
        owned.truncate((count.max(0) as usize).min(wanted));
        Ok(owned)
    }
}
