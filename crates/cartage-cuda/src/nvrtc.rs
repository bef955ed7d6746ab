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

impl ImageKind {
    /// The cache file extension and the key's name for this kind.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ImageKind::Cubin => "cubin",
            ImageKind::Ptx => "ptx",
        }
    }
}

/// The options NVRTC compiles with for `--gpu-architecture=<arch>`: part of the disk cache's key,
/// so that a change here never loads an image built with the old ones.
pub(crate) fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "--diag-suppress=186".to_string(),
    ]
}

/// The smallest ELF64 file header; a CUBIN shorter than this is not one.
const ELF64_HEADER_BYTES: usize = 64;

/// Check `image` before it goes to `cuModuleLoadData`, which is given only a pointer and reads
/// as far as the image's own structure says: PTX up to its NUL, a CUBIN as far as its ELF header
/// points. Returns the image ready to load (PTX gains a terminating NUL when it lacks one), or
/// why it cannot be loaded. Needs no driver.
pub(crate) fn driver_image(kind: ImageKind, mut image: Vec<u8>) -> Result<Vec<u8>, String> {
    match kind {
        ImageKind::Ptx => {
            // The driver reads PTX as a C string: one that starts with NUL is empty.
            if image.first().is_none_or(|&b| b == 0) {
                return Err("the PTX image is empty".to_string());
            }
            if image.last() != Some(&0) {
                image.push(0);
            }
            Ok(image)
        }
        ImageKind::Cubin => {
            check_elf64(&image)?;
            Ok(image)
        }
    }
}

/// Checks that `image` is a 64-bit little-endian ELF file whose program and section header tables
/// lie inside it.
fn check_elf64(image: &[u8]) -> Result<(), String> {
    if image.len() < ELF64_HEADER_BYTES {
        return Err(format!(
            "the CUBIN image holds {} bytes, fewer than an ELF header",
            image.len()
        ));
    }
    if image[..4] != *b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err("the CUBIN image is not a 64-bit little-endian ELF file".to_string());
    }
    let u16_at = |at: usize| u64::from(u16::from_le_bytes([image[at], image[at + 1]]));
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&image[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    // (table offset, entry size, entry count) of the program and section header tables.
    let tables = [
        ("program", u64_at(0x20), u16_at(0x36), u16_at(0x38)),
        ("section", u64_at(0x28), u16_at(0x3A), u16_at(0x3C)),
    ];
    for (what, offset, entry, count) in tables {
        let end = (entry * count).checked_add(offset);
        if end.is_none_or(|end| end > image.len() as u64) {
            return Err(format!(
                "the CUBIN's {what} header table ({count} entries of {entry} bytes at {offset}) lies outside its {} bytes",
                image.len()
            ));
        }
    }
    Ok(())
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
    let options = options(arch);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with empty program and section tables.
    fn elf_header() -> Vec<u8> {
        let mut image = vec![0u8; ELF64_HEADER_BYTES];
        image[..6].copy_from_slice(b"\x7fELF\x02\x01");
        image
    }

    #[test]
    fn ptx_reaches_the_driver_nul_terminated() {
        let image = driver_image(ImageKind::Ptx, b".version 8.0".to_vec()).unwrap();
        assert_eq!(image.last(), Some(&0));
        assert_eq!(&image[..image.len() - 1], b".version 8.0");
        let already = driver_image(ImageKind::Ptx, b".version 8.0\0".to_vec()).unwrap();
        assert_eq!(already, b".version 8.0\0", "an existing NUL is kept, not doubled");
        assert!(driver_image(ImageKind::Ptx, Vec::new()).is_err());
        assert!(driver_image(ImageKind::Ptx, vec![0]).is_err());
    }

    #[test]
    fn cubins_must_be_whole_elf_files() {
        assert!(driver_image(ImageKind::Cubin, elf_header()).is_ok());
        assert!(driver_image(ImageKind::Cubin, Vec::new()).is_err());
        assert!(driver_image(ImageKind::Cubin, elf_header()[..63].to_vec()).is_err());
        let mut ptx_as_cubin = b".version 8.0".to_vec();
        ptx_as_cubin.resize(128, b' ');
        assert!(driver_image(ImageKind::Cubin, ptx_as_cubin).is_err());
        // A section header table that points past the end of the image.
        let mut past_end = elf_header();
        past_end[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        past_end[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        past_end[0x3C..0x3E].copy_from_slice(&1u16.to_le_bytes());
        let err = driver_image(ImageKind::Cubin, past_end.clone()).unwrap_err();
        assert!(err.contains("section header table"), "{err}");
        past_end.resize(128, 0);
        assert!(driver_image(ImageKind::Cubin, past_end).is_ok());
        // An offset so large that offset + size overflows.
        let mut overflow = elf_header();
        overflow[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        overflow[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        overflow[0x38..0x3A].copy_from_slice(&1u16.to_le_bytes());
        assert!(driver_image(ImageKind::Cubin, overflow).is_err());
    }

    #[test]
    fn options_name_the_architecture() {
        assert!(options("sm_90").contains(&"--gpu-architecture=sm_90".to_string()));
        assert_ne!(options("sm_90"), options("sm_80"));
    }
}
