// celpeer: upstream's DRA CEL (k8s.io/dynamic-resource-allocation/cel, i.e.
// cel-go with the Kubernetes libraries, as kube-scheduler compiles and runs
// device selectors) over the benchmark's fleet.
//
// Job: {"driver", "selectors": [...], "devices": [resource.k8s.io/v1 Device...], "runs"}.
// Result: raw (compile once, then one DeviceMatches per selector and device,
// best of runs), effective (a cold cel.Cache as the scheduler keeps, compile +
// evaluate: upstream caches compiled programs only), and the matching device
// indexes per selector so the benchmark can check both sides agree.
//
// For the corpus test (tests/integration/test_cel_corpus_eval.py) the job may add
// "report_compile_errors" (a selector that does not compile is reported in
// compile_errors, and not evaluated, instead of failing the whole job),
// "error_messages" (each runtime error's message, beside its device index) and
// "features" (the scheduler's CEL feature gates, for a release whose defaults or
// cluster gates differ from 1.37's defaults) and "skip_timing" (verdicts only: no
// timed runs, which would evaluate every selector on every device again).
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

	ReportCompileErrors bool      `json:"report_compile_errors"`
	ErrorMessages       bool      `json:"error_messages"`
	SkipTiming          bool      `json:"skip_timing"`
	Features            *jobGates `json:"features"`
}

// jobGates: the DRA gates that change the CEL environment (dracel.Features).
type jobGates struct {
	ConsumableCapacity bool `json:"consumable_capacity"`
	ListTypeAttributes bool `json:"list_type_attributes"`
}

type result struct {
	Evaluations      int     `json:"evaluations"`
	CompileSeconds   float64 `json:"compile_seconds"`
	RawSeconds       float64 `json:"raw_seconds"`
	EffectiveSeconds float64 `json:"effective_seconds"`
	Matches          [][]int `json:"matches"`
	Errors           [][]int `json:"errors"`
	// Only with report_compile_errors: "" where the selector compiled.
	CompileErrors []string `json:"compile_errors,omitempty"`
	// Only with error_messages: per selector, one message per index in Errors.
	ErrorTexts [][]string `json:"error_messages,omitempty"`
}

// kube-scheduler 1.37's defaults (DRAConsumableCapacity on, DRAListTypeAttributes off).
var features = dracel.Features{EnableConsumableCapacity: true}

func main() {
	var j job
	peerio.ReadJob(&j)
	if j.Runs < 1 {
		j.Runs = 1
	}
	if j.Features != nil {
		features = dracel.Features{
			EnableConsumableCapacity: j.Features.ConsumableCapacity,
			EnableListTypeAttributes: j.Features.ListTypeAttributes,
		}
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
	compileErrors := make([]string, len(j.Selectors))
	usable := make([]bool, len(j.Selectors))
	for i, expr := range j.Selectors {
		compiled[i] = dracel.GetCompiler(features).CompileCELExpression(expr, dracel.Options{})
		usable[i] = compiled[i].Error == nil
		if !usable[i] {
			if !j.ReportCompileErrors {
				peerio.Fail("compile %q: %v", expr, compiled[i].Error)
			}
			compileErrors[i] = compiled[i].Error.Error()
		}
	}
	res := result{Evaluations: len(j.Selectors) * len(devices), CompileSeconds: time.Since(start).Seconds()}
	if j.ReportCompileErrors {
		res.CompileErrors = compileErrors
	}

	evaluate := func(c dracel.CompilationResult, si int, record bool) {
		if !usable[si] {
			return
		}
		for di, d := range devices {
			ok, _, err := c.DeviceMatches(ctx, d)
			if !record {
				continue
			}
			if err != nil {
				res.Errors[si] = append(res.Errors[si], di)
				if j.ErrorMessages {
					res.ErrorTexts[si] = append(res.ErrorTexts[si], err.Error())
				}
			} else if ok {
				res.Matches[si] = append(res.Matches[si], di)
			}
		}
	}
	res.Matches = make([][]int, len(compiled))
	res.Errors = make([][]int, len(compiled))
	if j.ErrorMessages {
		res.ErrorTexts = make([][]string, len(compiled))
	}
	for si, c := range compiled {
		res.Matches[si], res.Errors[si] = []int{}, []int{}
		if j.ErrorMessages {
			res.ErrorTexts[si] = []string{}
		}
		evaluate(c, si, true)
	}
	if j.SkipTiming {
		j.Runs = 0
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
