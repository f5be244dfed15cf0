//! A test-only platform: Vec-backed segments that count the bytes they hold,
//! and a switch to make segment allocation fail.

use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::platform::{DeviceInfo, DeviceMemory, Platform, Segment};

#[derive(Debug, Default)]
pub(crate) struct TestPlatform {
    /// Bytes in segments not yet dropped.
    live_bytes: Arc<AtomicU64>,
    /// Segments handed out, ever.
    pub(crate) segments_made: AtomicUsize,
    /// The next this many segment allocations fail.
    fail_next: AtomicUsize,
}

impl TestPlatform {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(TestPlatform::default())
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::SeqCst)
    }

    /// Make the next `count` segment allocations fail.
    pub(crate) fn fail_next(&self, count: usize) {
        self.fail_next.store(count, Ordering::SeqCst);
    }
}

impl Platform for TestPlatform {
    fn name(&self) -> &str {
        "test"
    }
    fn version(&self) -> String {
        "0".into()
    }
    fn topology(&self) -> &[u32] {
        &[1]
    }
    fn devices(&self) -> &[DeviceInfo] {
        &[]
    }
    fn allocate_segment(&self, chip: usize, bytes: u64) -> Result<Segment> {
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(Error::Unavailable(format!(
                "test platform refused {bytes} bytes on chip {chip}"
            )));
        }
        let len = usize::try_from(bytes).map_err(|_| Error::invalid("segment too large"))?;
        self.live_bytes.fetch_add(bytes, Ordering::SeqCst);
        self.segments_made.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(TestMemory {
            data: Mutex::new(vec![0; len]),
            live_bytes: Arc::clone(&self.live_bytes),
        }))
    }
}

struct TestMemory {
    data: Mutex<Vec<u8>>,
    live_bytes: Arc<AtomicU64>,
}

impl std::fmt::Debug for TestMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TestMemory({} bytes)", self.len())
    }
}

impl Drop for TestMemory {
    fn drop(&mut self) {
        self.live_bytes.fetch_sub(self.len(), Ordering::SeqCst);
    }
}

impl TestMemory {
    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
        let end = offset
            .checked_add(len)
            .filter(|end| *end <= self.len())
            .ok_or_else(|| Error::invalid("access past the end of the segment"))?;
        Ok(offset as usize..end as usize)
    }
}

impl DeviceMemory for TestMemory {
    fn len(&self) -> u64 {
        self.data.lock().map(|d| d.len() as u64).unwrap_or(0)
    }
    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let range = self.range(offset, src.len() as u64)?;
        let mut data = self
            .data
            .lock()
            .map_err(|_| Error::Internal("poisoned".into()))?;
        data[range].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let range = self.range(offset, dst.len() as u64)?;
        let data = self
            .data
            .lock()
            .map_err(|_| Error::Internal("poisoned".into()))?;
        dst.copy_from_slice(&data[range]);
        Ok(())
    }
    fn copy_to(
        &self,
        offset: u64,
        dst: &dyn DeviceMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let mut bytes = vec![0; len as usize];
        self.read(offset, &mut bytes)?;
        dst.write(dst_offset, &bytes)
    }
    fn fill(&self, offset: u64, len: u64, value: u8) -> Result<()> {
        let range = self.range(offset, len)?;
        let mut data = self
            .data
            .lock()
            .map_err(|_| Error::Internal("poisoned".into()))?;
        data[range].fill(value);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
