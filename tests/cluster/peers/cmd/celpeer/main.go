// celpeer: upstream's DRA CEL (k8s.io/dynamic-resource-allocation/cel, i.e.
// cel-go with the Kubernetes libraries, as kube-scheduler compiles and runs
// device selectors) over the benchmark's fleet.
//
// Job: {"driver", "selectors": [...], "devices": [resource.k8s.io/v1 Device...], "runs"}.
// Result: raw (compile once, then one DeviceMatches per selector and device,
// best of runs), effective (a cold cel.Cache as the scheduler keeps, compile +
// evaluate: upstream caches compiled programs only), and the matching device
// indexes per selector so the benchmark can check both sides agree.
package main

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"draplugin.local/tests/cluster/peers/internal/peerio"
)

type job struct {
	Driver    string               `json:"driver"`
	Selectors []string             `json:"selectors"`
	Devices   []resourceapi.Device `json:"devices"`
	Runs      int                  `json:"runs"`
}

type result struct {
	Evaluations      int     `json:"evaluations"`
	CompileSeconds   float64 `json:"compile_seconds"`
	RawSeconds       float64 `json:"raw_seconds"`
	EffectiveSeconds float64 `json:"effective_seconds"`
	Matches          [][]int `json:"matches"`
	Errors           [][]int `json:"errors"`
}

// kube-scheduler 1.37's defaults (DRAConsumableCapacity on, DRAListTypeAttributes off).
var features = dracel.Features{EnableConsumableCapacity: true}

func main() {
	var j job
	peerio.ReadJob(&j)
	if j.Runs < 1 {
		j.Runs = 1
	}
	ctx := context.Background()
	devices := make([]dracel.Device, len(j.Devices))
	for i, d := range j.Devices {
		devices[i] = dracel.Device{
			Driver:                   j.Driver,
			AllowMultipleAllocations: d.AllowMultipleAllocations,
			Attributes:               d.Attributes,
			Capacity:                 d.Capacity,
		}
	}

	start := time.Now()
	compiled := make([]dracel.CompilationResult, len(j.Selectors))
	for i, expr := range j.Selectors {
		compiled[i] = dracel.GetCompiler(features).CompileCELExpression(expr, dracel.Options{})
		if compiled[i].Error != nil {
			peerio.Fail("compile %q: %v", expr, compiled[i].Error)
		}
	}
	res := result{Evaluations: len(j.Selectors) * len(devices), CompileSeconds: time.Since(start).Seconds()}

	evaluate := func(c dracel.CompilationResult, si int, record bool) {
		for di, d := range devices {
			ok, _, err := c.DeviceMatches(ctx, d)
			if !record {
				continue
			}
			if err != nil {
				res.Errors[si] = append(res.Errors[si], di)
			} else if ok {
				res.Matches[si] = append(res.Matches[si], di)
			}
		}
	}
	res.Matches = make([][]int, len(compiled))
	res.Errors = make([][]int, len(compiled))
	for si, c := range compiled {
		res.Matches[si], res.Errors[si] = []int{}, []int{}
		evaluate(c, si, true)
	}
	for run := 0; run < j.Runs; run++ {
		start = time.Now()
		for si, c := range compiled {
			evaluate(c, si, false)
		}
		if s := time.Since(start).Seconds(); run == 0 || s < res.RawSeconds {
			res.RawSeconds = s
		}
		// Effective: what the scheduler does for one pass, a fresh LRU of compiled
		// programs (cel.NewCache, as the DynamicResources plugin makes) and every evaluation.
		start = time.Now()
		cache := dracel.NewCache(10, features)
		for si, expr := range j.Selectors {
			evaluate(cache.GetOrCompile(expr), si, false)
		}
		if s := time.Since(start).Seconds(); run == 0 || s < res.EffectiveSeconds {
			res.EffectiveSeconds = s
		}
	}
	peerio.Write(res)
}
