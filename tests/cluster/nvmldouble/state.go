package main

// Shared state, kept like a kernel driver keeps it: one file every process using the double reads
// and changes under flock, so the plugin, a restarted plugin, nvidia-smi and a test's own pynvml all
// see the same MIG mode, GPU and compute instances, compute mode and memory limits.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"
)

type State struct {
	GPUs map[string]*GPUState `json:"gpus"` // by GPU UUID
}

type GPUState struct {
	MigMode        int                    `json:"migMode"`
	MigModePending int                    `json:"migModePending"`
	ComputeMode    int                    `json:"computeMode"`
	GpuInstances   []*GIState             `json:"gpuInstances"`
	MemoryLimits   map[string]MemoryLimit `json:"memoryLimits,omitempty"`
	// Every nvmlDeviceSetMemoryLimits_v1 call on the GPU, in order, with its result.
	MemoryLimitCalls []MemoryLimitCall `json:"memoryLimitCalls,omitempty"`
}

type GIState struct {
	ID               uint32     `json:"id"`
	ProfileID        uint32     `json:"profileId"`
	Start            uint32     `json:"start"`
	Size             uint32     `json:"size"`
	ComputeInstances []*CIState `json:"computeInstances"`
}

type CIState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileId"`
	Start     uint32 `json:"start"`
	Size      uint32 `json:"size"`
}

type MemoryLimitCall struct {
	Cgroup string `json:"cgroup"`
	Soft   uint64 `json:"soft"`
	Hard   uint64 `json:"hard"`
	Result int    `json:"result"` // the nvmlReturn_t answered
}

type MemoryLimit struct {
	Soft uint64 `json:"soft"`
	Hard uint64 `json:"hard"`
}

func (s *GPUState) gi(id uint32) *GIState {
	for _, gi := range s.GpuInstances {
		if gi.ID == id {
			return gi
		}
	}
	return nil
}

func (gi *GIState) ci(id uint32) *CIState {
	for _, ci := range gi.ComputeInstances {
		if ci.ID == id {
			return ci
		}
	}
	return nil
}

func openLocked(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func decodeState(f *os.File) (*State, error) {
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	s := &State{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, s); err != nil {
			return nil, fmt.Errorf("state file %s: %v", f.Name(), err)
		}
	}
	if s.GPUs == nil {
		s.GPUs = map[string]*GPUState{}
	}
	return s, nil
}

// readState reads the state under a shared lock: every call sees what the last mutation wrote.
func readState(path string) (*State, error) {
	f, err := openLocked(path, syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decodeState(f)
}

// mutateState is one read-modify-write under an exclusive lock; fn's state is written back
// only when fn reports a change.
func mutateState(path string, fn func(*State) bool) error {
	f, err := openLocked(path, syscall.LOCK_EX)
	if err != nil {
		return err
	}
	defer f.Close()
	s, err := decodeState(f)
	if err != nil {
		return err
	}
	if !fn(s) {
		return nil
	}
	for _, g := range s.GPUs {
		sort.Slice(g.GpuInstances, func(i, j int) bool { return g.GpuInstances[i].ID < g.GpuInstances[j].ID })
		for _, gi := range g.GpuInstances {
			sort.Slice(gi.ComputeInstances, func(i, j int) bool { return gi.ComputeInstances[i].ID < gi.ComputeInstances[j].ID })
		}
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(data, '\n'), 0); err != nil {
		return err
	}
	return nil
}
