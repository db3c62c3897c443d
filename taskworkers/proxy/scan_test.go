package proxy

import (
	"encoding/json"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"

	"github.com/conductor-sidecar/sidecar/adapter"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// scanSeeds are tasks and task results as Conductor and the SDKs send
// them, and hostile variants of them.
var scanSeeds = []string{
	`{"taskType":"pass_1","status":"IN_PROGRESS","inputData":{"n":3,"item":{"id":"t3","size":3},"source":"benchmark"},"referenceTaskName":"t3","retryCount":0,"seq":5,"pollCount":1,"taskDefName":"pass_1","scheduledTime":1764230000000,"workflowInstanceId":"0b6f-wf","workflowType":"passthru_1","taskId":"7c1e-task","callbackAfterSeconds":0,"workerId":"bench","outputData":{},"workflowTask":{"name":"pass_1","taskReferenceName":"t3","inputParameters":{"n":3},"type":"SIMPLE","taskDefinition":{"name":"pass_1","retryCount":0,"timeoutSeconds":0}},"rateLimitPerFrequency":0,"iteration":0,"queueWaitTime":12}`,
	`{"taskId":"a","workflowType":"w","inputData":{"step":{"stepId":"x"}}}`,
	`{"taskId":"a","inputData":{"step":null}}`,
	`{"taskId":"a","inputData":{"step":1,"step":null}}`,
	`{"taskId":"a","inputData":{"step":null,"step":[1]}}`,
	`{"taskId":"a","inputData":{"st\u0065p":1}}`,
	`{"taskId":"a","inputData":null}`,
	`{"taskId":"a","inputData":{"step":1},"inputData":{"x":2}}`,
	`{"taskId":"a","inputData":{"step":1},"inputData":null,"inputData":{"x":1}}`,
	`{"TASKID":"a","WorkflowType":"w"}`,
	`{"taskId":"a","taskid":"b"}`,
	`{"task\u0049d":"b"}`,
	`{"taſkId":"b","workflowType":"w"}`,
	`{"taskId":"a\"b","workflowType":"w"}`,
	`{"taskId":"a\u0062","workflowType":"w"}`,
	`{"taskId":123}`,
	`{"taskId":null,"workflowType":"w"}`,
	`{"taskId":"é","workflowType":"wé"}`,
	"{\"taskId\":\"\xff\"}",
	`{"workflowInstanceId":"wf","taskId":"t","status":"COMPLETED","outputData":{"taskId":"inner","ok":true},"workerId":"w"}`,
	`{"taskId":"t","status":"COMPLETED","logs":[{"log":"a\\\"}","taskId":"x"}],"outputData":{"a":[1,{"b":"]"}]}}`,
	`[{"taskId":"a"}]`,
	`"taskId"`,
	`{"taskId":"a"} x`,
	`{}`,
	` { "taskId" : "a" , "inputData" : { } } `,
	`{"retryCount":"x","taskId":"a"}`,
	`{"taskId":"a","inputData":{"step":true}}`,
	`{"taskId":"a","inputData":[]}`,
	`{"taskId":"a","inputData":{"step":nul}}`,
}

// FuzzScanTask: whatever scanTask is sure of, encoding/json decodes the
// same from the same bytes, into the task the gate reads
// (adapter.PolledTask) and the result an update carries
// (model.TaskResult).
func FuzzScanTask(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkScan(t, b)
	})
}

func checkScan(t *testing.T, b []byte) {
	t.Helper()
	s, ok := scanTask(b)
	if !ok {
		return
	}
	var pt adapter.PolledTask
	if err := json.Unmarshal(b, &pt); err == nil {
		step := pt.InputData[plan.InputStep] != nil
		if pt.TaskID != s.taskID || pt.WorkflowType != s.workflowType || pt.Status != s.status || step != s.stepInput {
			t.Fatalf("%q: scanned %+v; encoding/json: taskId %q workflowType %q status %q step input %v", b, s,
				pt.TaskID, pt.WorkflowType, pt.Status, step)
		}
	}
	var res model.TaskResult
	if err := json.Unmarshal(b, &res); err == nil {
		if res.TaskId != s.taskID || string(res.Status) != s.status {
			t.Fatalf("%q: scanned %+v; encoding/json's task result: taskId %q status %q", b, s, res.TaskId, res.Status)
		}
	}
}

// TestScanTask: the seeds agree with encoding/json, and a task as
// Conductor sends it is read by the scan (not left to a full decode).
func TestScanTask(t *testing.T) {
	for _, s := range scanSeeds {
		checkScan(t, []byte(s))
	}
	s, ok := scanTask([]byte(scanSeeds[0]))
	if want := (scanned{taskID: "7c1e-task", workflowType: "passthru_1", status: "IN_PROGRESS"}); !ok || s != want {
		t.Fatalf("Conductor's task: scanned %+v (ok %v), want %+v", s, ok, want)
	}
	if s, ok := scanTask([]byte(scanSeeds[1])); !ok || !s.stepInput {
		t.Fatalf("a plan step's task: scanned %+v (ok %v), want its step input seen", s, ok)
	}
}
