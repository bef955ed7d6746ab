//! The raw NVRTC calls: compile one CUDA C source to a CUBIN for a real architecture (`sm_90`), or
//! to PTX for a virtual one (`compute_90`) when this NVRTC does not know the device's own.

use std::ffi::{CString, c_char, c_int};

use cudarc::nvrtc::result;
use cudarc::nvrtc::sys::{self, nvrtcProgram};

/// NVRTC's version as (major, minor).
pub(crate) fn version() -> Option<(i32, i32)> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: writes two integers through valid pointers.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    status.result().ok().map(|()| (major, minor))
}

/// The real architectures (`sm_XY` as XY) this NVRTC can produce code for.
pub(crate) fn supported_archs() -> Vec<i32> {
    let mut count: c_int = 0;
    // SAFETY: writes one integer through a valid pointer.
    if unsafe { sys::nvrtcGetNumSupportedArchs(&mut count) }.result().is_err() || count <= 0 {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; count as usize];
    // SAFETY: `archs` holds exactly `count` integers, as NVRTC asked for.
    if unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .is_err()
    {
        return Vec::new();
    }
    archs
}

/// What NVRTC produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageKind {
    /// Machine code for one real architecture.
    Cubin,
    /// NUL-terminated PTX, compiled by the driver at load.
    Ptx,
}

/// Destroys the program on every path out of [`compile`].
struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once, here.
        if let Err(e) = unsafe { result::destroy_program(self.0) } {
            tracing::warn!(error = %e, "nvrtcDestroyProgram failed");
        }
    }
}

/// Compile `source` (named `name` in messages) for `--gpu-architecture=<arch>`; `Err` carries
/// NVRTC's log.
pub(crate) fn compile(name: &str, source: &str, arch: &str, kind: ImageKind) -> Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|_| format!("{name}: the source contains a NUL byte"))?;
    let cname = CString::new(name).map_err(|_| format!("{name}: the name contains a NUL byte"))?;
    let program = Program(result::create_program(&src, Some(&cname)).map_err(|e| format!("{name}: {e}"))?);
    let options = [
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "--diag-suppress=186".to_string(),
    ];
    // SAFETY: `program` is live (destroyed only by its drop), and `src`/`cname` outlive it.
    if let Err(e) = unsafe { result::compile_program(program.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }
            .map(|log| c_chars_to_string(&log))
            .unwrap_or_default();
        return Err(format!("{name} for {arch}: {e}\n{log}"));
    }
    match kind {
        ImageKind::Ptx => {
            // SAFETY: the program compiled; `get_ptx` sizes its own buffer.
            let ptx = unsafe { result::get_ptx(program.0) }.map_err(|e| format!("{name}: {e}"))?;
            let mut bytes: Vec<u8> = ptx.iter().map(|&c| c as u8).collect();
            if bytes.last() != Some(&0) {
                bytes.push(0);
            }
            Ok(bytes)
        }
        ImageKind::Cubin => {
            let mut size = 0usize;
            // SAFETY: the program compiled for a real architecture; writes one size.
            unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
                .result()
                .map_err(|e| format!("{name}: {e}"))?;
            let mut cubin = vec![0u8; size];
            // SAFETY: `cubin` holds exactly the `size` bytes NVRTC reported.
            unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr() as *mut c_char) }
                .result()
                .map_err(|e| format!("{name}: {e}"))?;
            Ok(cubin)
        }
    }
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
