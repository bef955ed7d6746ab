//! Out-of-memory that explains itself (R22, R28), forced deterministically with an allocator
//! limit on every device under test: the error names the request and where it was made, the
//! device's capacity and free memory, allocated and reserved bytes, the largest free block, and
//! the largest live tensors with the lines that created them; fragmentation is named when it is
//! the cause.

mod memory_support;

use cartage::{DType, Device, Error, OomReport, Tensor, backend, empty_cache, memory_stats};
use memory_support::{devices_under_test, serial};

const MIB: usize = 1 << 20;

/// Caps `device`'s reserved memory at its current reserve + `headroom`; lifts the cap on drop.
struct LimitGuard(Device);

impl LimitGuard {
    fn set(device: &Device, headroom: usize) -> Self {
        empty_cache(device).unwrap();
        let b = backend(device).unwrap();
        b.allocator()
            .set_limit(Some(b.memory_stats().reserved_bytes + headroom));
        LimitGuard(*device)
    }
}

impl Drop for LimitGuard {
    fn drop(&mut self) {
        backend(&self.0).unwrap().allocator().set_limit(None);
    }
}

fn oom_report(result: cartage::Result<Tensor>) -> OomReport {
    match result {
        Err(Error::OutOfMemory(report)) => *report,
        Err(other) => panic!("expected an out-of-memory error, got {other}"),
        Ok(t) => panic!("expected an out-of-memory error, got a tensor {t:?}"),
    }
}

#[test]
fn oom_names_sizes_and_the_lines_that_hold_the_memory() {
    let _guard = serial();
    for device in devices_under_test("memory_oom/live") {
        let _limit = LimitGuard::set(&device, 40 * MIB);
        let holder = Tensor::zeros(&[4 * MIB], DType::U8, &device).unwrap();
        let holder_line = line!() - 1;
        let oom_count = memory_stats(&device).unwrap().oom_count;
        let report = oom_report(Tensor::zeros(&[64 * MIB], DType::U8, &device));
        let request_line = line!() - 1;
        let text = report.to_string();
        println!("{text}");

        assert_eq!(report.device, device);
        assert_eq!(report.requested, 64 * MIB);
        let at = report.requested_at.expect("the failing request's site");
        assert!(
            at.file().ends_with("memory_oom.rs") && at.line() == request_line,
            "{at}"
        );
        assert!(
            report.allocated >= 4 * MIB && report.reserved >= report.allocated,
            "{text}"
        );
        assert!(report.limit.is_some());
        let ours = report
            .largest_live
            .iter()
            .find(|b| b.site.file().ends_with("memory_oom.rs") && b.site.line() == holder_line)
            .unwrap_or_else(|| panic!("the holder's line is not among the largest live blocks: {text}"));
        assert!(ours.bytes >= 4 * MIB);
        assert!(!report.fragmentation_is_cause());
        assert_eq!(memory_stats(&device).unwrap().oom_count, oom_count + 1);

        for expected in [
            format!("out of memory on {device}: tried to allocate 64.00 MiB at "),
            format!("memory_oom.rs:{request_line}"),
            format!("memory_oom.rs:{holder_line}"),
            "allocated by live tensors".to_string(),
            "largest free block".to_string(),
            "Live tensors hold the memory".to_string(),
        ] {
            assert!(text.contains(&expected), "missing `{expected}` in: {text}");
        }
        if let (Some(total), Some(free)) = (report.capacity, report.free) {
            assert!(free <= total);
            assert!(text.contains("in total") && text.contains(" free"), "{text}");
        } else {
            memory_support::skip(&format!(
                "memory_oom/live on {device}: the device does not report capacity"
            ));
        }
        drop(holder);
    }
}

#[test]
fn oom_says_when_fragmentation_is_the_cause() {
    let _guard = serial();
    for device in devices_under_test("memory_oom/fragmentation") {
        // One 20 MiB segment (the allocator's size for medium requests) and no room for another.
        let _limit = LimitGuard::set(&device, 20 * MIB);
        let mut blocks: Vec<Option<Tensor>> = (0..5)
            .map(|_| Some(Tensor::zeros(&[4 * MIB], DType::U8, &device).unwrap()))
            .collect();
        for i in [0, 2, 4] {
            blocks[i] = None; // 12 MiB free, in three separate 4 MiB holes
        }
        let stats = memory_stats(&device).unwrap();
        assert!(stats.fragmentation() > 0.5, "{stats:?}");
        let report = oom_report(Tensor::zeros(&[8 * MIB], DType::U8, &device));
        let text = report.to_string();
        println!("{text}");
        assert!(report.reserved - report.allocated >= 12 * MIB, "{text}");
        assert!(report.largest_free_block < 8 * MIB, "{text}");
        assert!(report.fragmentation_is_cause(), "{text}");
        assert!(text.contains("Fragmentation is the cause"), "{text}");
        drop(blocks);
    }
}

#[test]
fn an_absurd_request_is_an_error_not_a_hang() {
    let _guard = serial();
    for device in devices_under_test("memory_oom/absurd") {
        // The frontend refuses sizes beyond the address space before allocating.
        let err = Tensor::zeros(&[usize::MAX - MIB], DType::U8, &device).unwrap_err();
        assert!(
            matches!(err, Error::SizeOverflow { .. } | Error::OutOfMemory(_)),
            "{err}"
        );
        // The allocator itself: rounds to 512 bytes fine, then overflows when rounded up to a
        // large segment — an error, never a deadlock.
        let b = backend(&device).unwrap();
        match b.alloc(usize::MAX - MIB, std::panic::Location::caller()) {
            Err(Error::OutOfMemory(report)) => assert_eq!(report.requested, usize::MAX - MIB),
            Err(other) => panic!("expected out of memory, got {other}"),
            Ok(allocation) => {
                b.free(allocation);
                panic!("{device} claims to have allocated usize::MAX - 1 MiB")
            }
        }
    }
}
