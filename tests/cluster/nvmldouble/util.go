package main

import (
	"fmt"
	"strconv"
	"time"
)

func itoa[T ~uint32 | ~int](v T) string { return strconv.Itoa(int(v)) }

func nowMicros() int64 { return time.Now().UnixMicro() }

func fmtSscanf(s string, domain, bus, dev, fn *uint32) (int, error) {
	return fmt.Sscanf(s, "%x:%x:%x.%x", domain, bus, dev, fn)
}

// formatBusID is NVML_DEVICE_PCI_BUS_ID_FMT, "%08X:%02X:%02X.0".
func formatBusID(domain, bus, dev uint32) string {
	return fmt.Sprintf("%08X:%02X:%02X.0", domain, bus, dev)
}

// formatLegacyBusID is NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, "%04X:%02X:%02X.0".
func formatLegacyBusID(domain, bus, dev uint32) string {
	return fmt.Sprintf("%04X:%02X:%02X.0", domain, bus, dev)
}
