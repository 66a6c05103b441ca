//! The compute device of a stage run.
//!
//! ```
//! use embodyflow_core::cli::Device;
//! let device = embodyflow_models::device::tch_device(Device::Cpu).unwrap();
//! assert_eq!(device, tch::Device::Cpu);
//! ```

use embodyflow_core::Error;
use embodyflow_core::cli::Device;

/// Maps `--device` to a tch device; `cuda:N` must exist on this machine.
pub fn tch_device(device: Device) -> Result<tch::Device, Error> {
    match device {
        Device::Cpu => Ok(tch::Device::Cpu),
        Device::Cuda(index) => {
            let available = tch::Cuda::device_count() as usize;
            if index < available {
                Ok(tch::Device::Cuda(index))
            } else {
                Err(Error::Usage(format!(
                    "--device cuda:{index}: this machine has {available} CUDA device(s)"
                )))
            }
        }
    }
}
