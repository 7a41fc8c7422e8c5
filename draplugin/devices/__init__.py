"""GPU discovery behind one interface: NVML on real hardware, fake GPUs elsewhere."""
