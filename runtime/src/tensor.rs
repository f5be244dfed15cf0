//! Tensor descriptors: where a tensor's elements sit in device memory.
//! A frontend passes these for every op: a buffer, a byte offset, sizes,
//! strides (in elements) and a dtype. Views are descriptors over the same
//! buffer; nothing is copied to make one.

use crate::buffer::Buffer;
use crate::copy::Layout;
use crate::error::{Error, Result};
use crate::ir::{DType, TensorType};

#[derive(Clone, Debug)]
pub struct DeviceTensor {
    pub buffer: Buffer,
    pub dtype: DType,
    /// Offset in bytes; sizes and strides in elements; elem_size = dtype size.
    pub layout: Layout,
}

impl DeviceTensor {
    /// A contiguous tensor over the start of `buffer`.
    pub fn contiguous(buffer: Buffer, dtype: DType, dims: &[u64]) -> Result<Self> {
        Self::new(buffer, dtype, 0, dims, None)
    }

    /// A view; `strides` None means row-major contiguous. The view must lie
    /// inside the buffer.
    pub fn new(
        buffer: Buffer,
        dtype: DType,
        offset: u64,
        dims: &[u64],
        strides: Option<&[u64]>,
    ) -> Result<Self> {
        let elem_size = dtype.size() as u64;
        let layout = match strides {
            // Given strides are taken as they are: building the contiguous
            // ones first only to replace them cost every op's inputs.
            Some(s) => {
                if s.len() != dims.len() {
                    return Err(Error::invalid(format!(
                        "{} strides for {} dimensions",
                        s.len(),
                        dims.len()
                    )));
                }
                Layout {
                    offset,
                    sizes: crate::copy::Dims::from_slice(dims),
                    strides: crate::copy::Dims::from_slice(s),
                    elem_size,
                }
            }
            None => Layout {
                offset,
                ..Layout::contiguous(dims, elem_size)
            },
        };
        if !offset.is_multiple_of(elem_size) {
            return Err(Error::invalid(format!(
                "offset {offset} is not a multiple of the {dtype} element size {}",
                dtype.size()
            )));
        }
        layout.check_within(buffer.len(), "view")?;
        Ok(DeviceTensor {
            buffer,
            dtype,
            layout,
        })
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, &self.layout.sizes)
    }

    pub fn dims(&self) -> &[u64] {
        &self.layout.sizes
    }

    pub fn numel(&self) -> u64 {
        self.layout.numel()
    }

    /// Row-major contiguous from its offset (so one run of bytes).
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The same view over a work reference to its buffer, for work queued
    /// on `stream` (see [`Buffer::for_work`]).
    pub fn for_work(&self, stream: &std::sync::Arc<crate::stream::StreamClock>) -> DeviceTensor {
        DeviceTensor {
            buffer: self.buffer.for_work(stream),
            dtype: self.dtype,
            layout: self.layout.clone(),
        }
    }

    /// Whether two descriptors may touch a common byte (same buffer and
    /// overlapping byte ranges; conservative for strided views).
    pub fn may_overlap(&self, other: &DeviceTensor) -> bool {
        if !self.buffer.same_buffer(&other.buffer) || self.numel() == 0 || other.numel() == 0 {
            return false;
        }
        let (a0, a1) = self.byte_range();
        let (b0, b1) = other.byte_range();
        a0 < b1 && b0 < a1
    }

    /// [first byte, one past the last byte] the view can touch.
    pub fn byte_range(&self) -> (u64, u64) {
        let l = &self.layout;
        let last: u64 = l
            .sizes
            .iter()
            .zip(&l.strides)
            .map(|(&n, &s)| n.saturating_sub(1) * s)
            .sum();
        (l.offset, l.offset + (last + 1) * l.elem_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Runtime, RuntimeOptions};

    /// Given strides are kept as given, none means contiguous, and a
    /// wrong stride count, a misaligned offset or a view past the buffer
    /// is an error naming what was wrong.
    #[test]
    fn views_take_their_strides_and_refuse_bad_ones() {
        let r = Runtime::new(&RuntimeOptions {
            platform: Some("host".into()),
            cache: Some(crate::compile::CacheConfig::memory_only(4)),
            ..Default::default()
        })
        .unwrap();
        let s = r.default_stream(0).unwrap();
        let b = r.allocate(0, 4 * 24, &s).unwrap();
        let c = DeviceTensor::new(b.clone(), DType::F32, 8, &[2, 3, 2], None).unwrap();
        assert_eq!(&c.layout.strides[..], &[6, 2, 1]);
        assert_eq!(c.layout.offset, 8);
        assert!(c.is_contiguous());
        let t = DeviceTensor::new(b.clone(), DType::F32, 0, &[3, 2], Some(&[1, 3])).unwrap();
        assert_eq!(&t.layout.strides[..], &[1, 3]);
        assert!(!t.is_contiguous());
        let e = DeviceTensor::new(b.clone(), DType::F32, 0, &[3, 2], Some(&[1]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 strides for 2 dimensions"), "{e}");
        let e = DeviceTensor::new(b.clone(), DType::F32, 2, &[3], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("offset 2"), "{e}");
        assert!(DeviceTensor::new(b, DType::F32, 0, &[25], None).is_err());
    }
}
