//! The SM clock at measurement time, through NVML (`libnvidia-ml.so.1`, loaded at run time; it
//! ships with the driver). Records carry it as provenance: a GPU that throttles shows it here.
//! When NVML is missing, clocks read as 0 ("unknown") and nothing else changes. The board's energy
//! counter and temperature are polled while a kernel runs (`timing`'s energy and settle phases),
//! for energy per launch and the steady state (`crate::energy`).

use std::ffi::{CString, c_char, c_uint};

type NvmlDevice = *mut std::ffi::c_void;
/// NVML_CLOCK_SM.
const CLOCK_SM: c_uint = 1;
const SUCCESS: c_uint = 0;
/// NVML_TEMPERATURE_GPU.
const TEMPERATURE_GPU: c_uint = 0;
/// The clock event reasons that hold the clock down under load (`nvmlClocksEventReason*`):
/// SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40,
/// HwPowerBrakeSlowdown 0x80. Idle (0x1) and the application clock setting (0x2) are not.
const HELD_DOWN: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
/// Below this share of its maximum the SM clock counts as still held down after a cap let go
/// (unless it is below [`IDLE_SHARE`]): the reasons clear as soon as the load ends, but the clock
/// climbs back over a few hundred milliseconds (an H200's finalist rounds, 2026-11-29: timings
/// that waited for the reasons alone started at 1485-1575 MHz of 1980 and read 3.6-5.4% slower
/// than cool-start shots).
const FULL_SHARE: f64 = 0.97;
/// Below this share of its maximum the SM clock is an idle GPU's (345 MHz of 1980 on an H200),
/// which starts cool.
const IDLE_SHARE: f64 = 0.5;
/// How long a poll reuses the clock and temperature it read, milliseconds: an energy read alone
/// takes 3-5 ms on an H200 (2026-11-28), so every call left out of the loop sharpens when the
/// counter's changes are seen; a 100 ms point of the state trace still averages several clocks.
const STATE_REUSE_MS: f64 = 20.0;

/// An NVML handle on one GPU.
pub(crate) struct Nvml {
    // The library must outlive the function pointers taken from it.
    _lib: libloading::Library,
    clock_info: unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_uint,
    /// `nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver loaded), when the
    /// library has it.
    energy: Option<unsafe extern "C" fn(NvmlDevice, *mut u64) -> c_uint>,
    /// `nvmlDeviceGetTemperature`, when the library has it.
    temperature: Option<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_uint>,
    /// `nvmlDeviceGetCurrentClocksEventReasons` (or its older name, `...ThrottleReasons`), when
    /// the library has it.
    reasons: Option<unsafe extern "C" fn(NvmlDevice, *mut u64) -> c_uint>,
    /// The SM clock's maximum in MHz (`nvmlDeviceGetMaxClockInfo`), 0 when NVML cannot say.
    max_clock_mhz: u32,
    device: NvmlDevice,
    /// The last clock and temperature read, and when (a poll's `t_ms`).
    state: std::cell::Cell<Option<(f64, u32, u32)>>,
}

impl Nvml {
    /// Opens NVML and finds the GPU with `uuid` (as the driver prints it, `GPU-...`).
    pub(crate) fn open(uuid: &str) -> Option<Nvml> {
        // SAFETY: loading the driver's NVML library runs its initialisers, which have no
        // preconditions; the symbols are looked up with their documented C signatures.
        unsafe {
            let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
            let init: libloading::Symbol<unsafe extern "C" fn() -> c_uint> = lib.get(b"nvmlInit_v2").ok()?;
            let by_uuid: libloading::Symbol<unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> c_uint> =
                lib.get(b"nvmlDeviceGetHandleByUUID").ok()?;
            let clock: libloading::Symbol<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_uint> =
                lib.get(b"nvmlDeviceGetClockInfo").ok()?;
            if init() != SUCCESS {
                return None;
            }
            let id = CString::new(uuid).ok()?;
            let mut device: NvmlDevice = std::ptr::null_mut();
            if by_uuid(id.as_ptr(), &mut device) != SUCCESS {
                return None;
            }
            let clock_info = *clock;
            let energy = lib
                .get::<unsafe extern "C" fn(NvmlDevice, *mut u64) -> c_uint>(b"nvmlDeviceGetTotalEnergyConsumption")
                .ok()
                .map(|f| *f);
            let temperature = lib
                .get::<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_uint>(b"nvmlDeviceGetTemperature")
                .ok()
                .map(|f| *f);
            let reasons =
                [&b"nvmlDeviceGetCurrentClocksEventReasons"[..], b"nvmlDeviceGetCurrentClocksThrottleReasons"]
                    .iter()
                    .find_map(|name| {
                        lib.get::<unsafe extern "C" fn(NvmlDevice, *mut u64) -> c_uint>(*name).ok().map(|f| *f)
                    });
            let mut max_clock_mhz: c_uint = 0;
            if let Ok(max) =
                lib.get::<unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> c_uint>(b"nvmlDeviceGetMaxClockInfo")
                && max(device, CLOCK_SM, &mut max_clock_mhz) != SUCCESS
            {
                max_clock_mhz = 0;
            }
            Some(Nvml {
                _lib: lib,
                clock_info,
                energy,
                temperature,
                reasons,
                max_clock_mhz,
                device,
                state: std::cell::Cell::new(None),
            })
        }
    }

    /// The current SM clock in MHz, or 0 when NVML cannot say.
    pub(crate) fn sm_clock_mhz(&self) -> u32 {
        let mut mhz: c_uint = 0;
        // SAFETY: the device handle came from this library, which is still loaded; mhz is valid.
        if unsafe { (self.clock_info)(self.device, CLOCK_SM, &mut mhz) } == SUCCESS { mhz } else { 0 }
    }

    /// The board's energy counter in millijoules (since the driver loaded), or `None` when NVML
    /// cannot say (older GPUs, or a library without the call).
    pub(crate) fn energy_mj(&self) -> Option<u64> {
        let read = self.energy?;
        let mut mj: u64 = 0;
        // SAFETY: as for the clock: a live handle from this library and a valid out-pointer.
        (unsafe { read(self.device, &mut mj) } == SUCCESS).then_some(mj)
    }

    /// The GPU's temperature in degrees Celsius, or 0 when NVML cannot say.
    pub(crate) fn temperature_c(&self) -> u32 {
        let Some(read) = self.temperature else { return 0 };
        let mut c: c_uint = 0;
        // SAFETY: as for the clock; NVML_TEMPERATURE_GPU is sensor 0.
        if unsafe { read(self.device, TEMPERATURE_GPU, &mut c) } == SUCCESS { c } else { 0 }
    }
}

impl super::timing::Probe for Nvml {
    fn capped(&self) -> bool {
        let held = self.reasons.is_some_and(|read| {
            let mut reasons: u64 = 0;
            // SAFETY: as for the clock: a live handle from this library and a valid out-pointer.
            (unsafe { read(self.device, &mut reasons) } == SUCCESS) && reasons & HELD_DOWN != 0
        });
        held || climbing(self.sm_clock_mhz(), self.max_clock_mhz)
    }

    fn poll(&self, t_ms: f64) -> crate::energy::Poll {
        let energy_mj = self.energy_mj();
        let (clock_mhz, temperature_c) = match self.state.get() {
            // A phase's clock starts at 0 ms: a later phase reads afresh.
            Some((at, clock, temp)) if t_ms >= at && t_ms - at < STATE_REUSE_MS => (clock, temp),
            _ => {
                let read = (self.sm_clock_mhz(), self.temperature_c());
                self.state.set(Some((t_ms, read.0, read.1)));
                read
            }
        };
        crate::energy::Poll { t_ms, energy_mj, clock_mhz, temperature_c }
    }
}

/// Whether an SM clock of `mhz` is still climbing back to its maximum `max_mhz` after a cap: below
/// [`FULL_SHARE`] of it but above an idle GPU's [`IDLE_SHARE`] (false when either is unknown).
fn climbing(mhz: u32, max_mhz: u32) -> bool {
    let (mhz, max) = (f64::from(mhz), f64::from(max_mhz));
    mhz > 0.0 && max > 0.0 && mhz < FULL_SHARE * max && mhz > IDLE_SHARE * max
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_clock_between_idle_and_full_is_still_climbing() {
        let max = 1980;
        for (mhz, climbing) in
            [(1980, false), (1935, false), (1575, true), (1485, true), (1000, true), (345, false), (0, false)]
        {
            assert_eq!(super::climbing(mhz, max), climbing, "{mhz} MHz of {max}");
        }
        assert!(!super::climbing(1500, 0), "no maximum known: nothing to tell it by");
    }
}
