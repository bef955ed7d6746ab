//! Tests of the harness against fake devices whose timing is known: a synchronous one (a CPU
//! whose op sleeps) and an asynchronous one whose `launch` only queues the work for a device
//! thread, as a GPU stream does. They show that [`Bench`] times the device, not the dispatch.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cartage_core::allocator::testing::MockSource;
use cartage_core::raw::{Allocation, BufferSlice};
use cartage_core::{
    Backend, CachingAllocator, Capabilities, DType, Device, DeviceInfo, Error, Event, Kernel, Layout, Result, Scalar,
    TensorArg,
};

use super::{Bench, Timing, TimingMode};

/// A point on the fake device's timeline, set when its thread reaches it.
#[derive(Default)]
struct Marker {
    reached: Mutex<Option<Instant>>,
    done: Condvar,
}

impl Marker {
    fn set(&self) {
        *self.reached.lock().unwrap() = Some(Instant::now());
        self.done.notify_all();
    }

    fn wait(&self) -> Instant {
        let mut reached = self.reached.lock().unwrap();
        loop {
            if let Some(at) = *reached {
                return at;
            }
            reached = self.done.wait(reached).unwrap();
        }
    }
}

enum Command {
    Work(Duration),
    Mark(Arc<Marker>),
}

/// A device whose every kernel takes `op_time` (plus `first_call_extra` on the first launch).
/// Asynchronous: `launch` queues the work on a device thread and returns at once, events are
/// markers in that queue. Synchronous: `launch` does the work before returning.
struct FakeDevice {
    queue: Option<Mutex<Sender<Command>>>,
    op_time: Duration,
    first_call_extra: Duration,
    launches: AtomicU64,
    capabilities: Capabilities,
    allocator: CachingAllocator,
}

impl FakeDevice {
    fn new(asynchronous: bool, op_time: Duration) -> Arc<Self> {
        let queue = asynchronous.then(|| {
            let (send, receive) = channel::<Command>();
            thread::spawn(move || {
                for command in receive {
                    match command {
                        Command::Work(time) => thread::sleep(time),
                        Command::Mark(marker) => marker.set(),
                    }
                }
            });
            Mutex::new(send)
        });
        let mut capabilities = Capabilities::all_defined(|_, _| false);
        capabilities.device_timing = true;
        Arc::new(FakeDevice {
            queue,
            op_time,
            first_call_extra: Duration::ZERO,
            launches: AtomicU64::new(0),
            capabilities,
            allocator: CachingAllocator::new(Device::cpu(), Box::new(MockSource::new(1 << 30)), Default::default()),
        })
    }

    fn with_slow_first_call(op_time: Duration, extra: Duration) -> Arc<Self> {
        let mut device = Arc::into_inner(FakeDevice::new(false, op_time)).unwrap();
        device.first_call_extra = extra;
        Arc::new(device)
    }

    fn submit(&self, command: Command) -> Result<()> {
        match &self.queue {
            Some(queue) => queue.lock().unwrap().send(command).map_err(|_| Error::Driver {
                device: Device::cpu(),
                op: "submit",
                message: "the fake device thread stopped".into(),
            }),
            None => {
                match command {
                    Command::Work(time) => thread::sleep(time),
                    Command::Mark(marker) => marker.set(),
                }
                Ok(())
            }
        }
    }

    /// Launch `kernel` (the fake device never touches memory).
    fn go(&self, kernel: &Kernel) -> Result<()> {
        // SAFETY: the fake device only sleeps; it never reads or writes the kernel's buffers.
        unsafe { self.launch(kernel) }
    }

    /// A kernel over a small buffer of this device.
    fn fill_kernel(&self) -> (Kernel, Allocation) {
        let allocation = self.allocator.alloc(64).unwrap();
        let out = TensorArg {
            buffer: allocation.slice(),
            layout: Layout::contiguous(&[16]).unwrap(),
            dtype: DType::F32,
        };
        let kernel = Kernel::Fill {
            out,
            value: Scalar::Float(1.0),
        };
        (kernel, allocation)
    }
}

impl Backend for FakeDevice {
    fn device(&self) -> Device {
        Device::cpu()
    }
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            device: Device::cpu(),
            name: "fake device".into(),
            total_memory: None,
            details: Vec::new(),
        }
    }
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }
    fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }
    unsafe fn write(&self, _dst: BufferSlice, _src: &[u8]) -> Result<()> {
        Ok(())
    }
    unsafe fn read(&self, _src: BufferSlice, _dst: &mut [u8]) -> Result<()> {
        self.synchronize()
    }
    unsafe fn copy_within(&self, _src: BufferSlice, _dst: BufferSlice) -> Result<()> {
        Ok(())
    }
    unsafe fn launch(&self, kernel: &Kernel) -> Result<()> {
        self.check_supported(kernel)?;
        kernel.validate()?;
        let first = self.launches.fetch_add(1, Ordering::SeqCst) == 0;
        let extra = if first { self.first_call_extra } else { Duration::ZERO };
        self.submit(Command::Work(self.op_time + extra))
    }
    fn synchronize(&self) -> Result<()> {
        let marker = Arc::new(Marker::default());
        self.submit(Command::Mark(marker.clone()))?;
        marker.wait();
        Ok(())
    }
    fn record_event(&self) -> Result<Event> {
        let marker = Arc::new(Marker::default());
        self.submit(Command::Mark(marker.clone()))?;
        Ok(Event::new(marker))
    }
    fn elapsed(&self, start: &Event, end: &Event) -> Result<Duration> {
        let marker = |event: &Event| event.downcast_ref::<Arc<Marker>>().unwrap().wait();
        Ok(marker(end).saturating_duration_since(marker(start)))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn short_bench() -> Bench {
    Bench::new()
        .warmup(Duration::from_millis(5))
        .budget(Duration::from_millis(60))
        .samples(3, 8)
}

#[test]
fn a_synchronous_op_is_timed_at_its_duration() {
    let op = Duration::from_millis(5);
    let device = FakeDevice::new(false, op);
    let (kernel, _buffer) = device.fill_kernel();
    let m = short_bench().run(device.as_ref(), || device.go(&kernel)).unwrap();
    assert_eq!(m.timing(), Timing::DeviceEvents);
    assert!(m.median() >= op, "a 5 ms op measured {m}");
    assert!(m.p10() <= m.median() && m.median() <= m.p90(), "{m}");
    assert!((3..=8).contains(&m.samples().len()), "{m}");
}

#[test]
fn an_asynchronous_op_is_timed_on_the_device_not_at_dispatch() {
    let op = Duration::from_millis(10);
    let device = FakeDevice::new(true, op);
    let (kernel, _buffer) = device.fill_kernel();

    // What a host timer without synchronisation reads: the time to queue the work.
    let mut dispatch: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            device.go(&kernel).unwrap();
            start.elapsed()
        })
        .collect();
    device.synchronize().unwrap();
    dispatch.sort_unstable();
    let naive = dispatch[2];

    for mode in [TimingMode::DeviceEvents, TimingMode::HostSynchronized] {
        let m = short_bench()
            .timing(mode)
            .run(device.as_ref(), || device.go(&kernel))
            .unwrap();
        assert!(m.median() >= op, "{mode:?}: a 10 ms device op measured {m}");
        assert!(
            naive * 4 < m.median(),
            "{mode:?}: the harness ({:?}) should read far above the unsynchronised host timer ({naive:?})",
            m.median()
        );
    }
    assert!(naive < op / 2, "queuing should be far quicker than the work: {naive:?}");
}

#[test]
fn warm_up_is_kept_out_of_the_samples() {
    let device = FakeDevice::with_slow_first_call(Duration::from_millis(2), Duration::from_millis(300));
    let (kernel, _buffer) = device.fill_kernel();
    let m = short_bench().run(device.as_ref(), || device.go(&kernel)).unwrap();
    assert!(m.warmup_iters() >= 2, "{m}");
    let slowest = m.samples().iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(150),
        "the slow first call leaked into a sample: {m}"
    );
    let calls = device.launches.load(Ordering::SeqCst);
    assert_eq!(
        calls,
        m.warmup_iters() + m.samples().len() as u64 * m.iters_per_sample()
    );
}

#[test]
fn an_error_from_the_work_ends_the_run() {
    let device = FakeDevice::new(false, Duration::ZERO);
    let (kernel, _buffer) = device.fill_kernel();
    let mut calls = 0;
    let result = short_bench().run(device.as_ref(), || {
        calls += 1;
        if calls > 3 {
            Err(Error::invalid("work", "fails on purpose"))
        } else {
            device.go(&kernel)
        }
    });
    let error = result.unwrap_err().to_string();
    assert!(error.contains("fails on purpose"), "{error}");
}
