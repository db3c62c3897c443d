package adapter

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// workflowWithTasks is a workflow of eight tasks (INLINE, WAIT) as
// Conductor 3.21.14 answers GET /workflow/{id}?includeTasks=true.
func workflowWithTasks(t testing.TB) []byte {
	b, err := os.ReadFile("testdata/workflow-with-tasks-3.21.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWorkflowTasks_KeepsWhatTheAdopterReads: the adopter's decode of a
// workflow with its tasks gives each field the adopter reads as the SDK's
// model does.
func TestWorkflowTasks_KeepsWhatTheAdopterReads(t *testing.T) {
	// Every field the adopter reads set, in the SDK's own encoding.
	every, err := json.Marshal(model.Workflow{WorkflowId: "wf-1", WorkflowName: "orders", WorkflowVersion: 3, Status: model.PausedWorkflow,
		StartTime: 1, EndTime: 2, CorrelationId: "order-7", ParentWorkflowId: "wf-0", ReasonForIncompletion: "why",
		Input: map[string]any{"a": 1.0}, TaskToDomain: map[string]string{"t": "d"},
		Tasks: []model.Task{{TaskId: "t-1", TaskType: "SUB_WORKFLOW", TaskDefName: "sub", Status: "IN_PROGRESS", ReferenceTaskName: "sub__2",
			Iteration: 2, RetryCount: 1, Retried: true, StartTime: 3, EndTime: 4, ReasonForIncompletion: "again",
			SubWorkflowId: "wf-2", WorkflowInstanceId: "wf-1", InputData: map[string]any{"big": "x"},
			WorkflowTask: &model.WorkflowTask{RetryCount: 2, TaskDefinition: &model.TaskDef{RetryCount: 3}}},
			{TaskId: "t-2", TaskType: "resize", StartTime: 5, WorkflowTask: &model.WorkflowTask{TaskDefinition: &model.TaskDef{RetryCount: 3}}}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"Conductor's answer": workflowWithTasks(t), "every field set": every} {
		t.Run(name, func(t *testing.T) { sameAsTheModel(t, b) })
	}
}

func sameAsTheModel(t *testing.T, b []byte) {
	var full model.Workflow
	if err := json.Unmarshal(b, &full); err != nil {
		t.Fatal(err)
	}
	var wt workflowTasks
	if err := json.Unmarshal(b, &wt); err != nil {
		t.Fatal(err)
	}
	got := wt.workflow()
	if got.WorkflowId != full.WorkflowId || got.WorkflowName != full.WorkflowName || got.WorkflowVersion != full.WorkflowVersion ||
		got.Status != full.Status || got.StartTime != full.StartTime || got.EndTime != full.EndTime || got.CorrelationId != full.CorrelationId ||
		got.ParentWorkflowId != full.ParentWorkflowId || got.ReasonForIncompletion != full.ReasonForIncompletion ||
		len(got.TaskToDomain) != len(full.TaskToDomain) ||
		len(got.Input) != len(full.Input) || len(got.Tasks) != len(full.Tasks) || len(got.Tasks) == 0 {
		t.Fatalf("workflow %+v\nwant %+v", got, full)
	}
	for i, w := range full.Tasks {
		g := got.Tasks[i]
		if g.TaskId != w.TaskId || g.TaskType != w.TaskType || g.TaskDefName != w.TaskDefName || g.Status != w.Status ||
			g.ReferenceTaskName != w.ReferenceTaskName || g.Iteration != w.Iteration || g.RetryCount != w.RetryCount ||
			g.Retried != w.Retried || g.StartTime != w.StartTime || g.EndTime != w.EndTime ||
			g.ReasonForIncompletion != w.ReasonForIncompletion || g.SubWorkflowId != w.SubWorkflowId ||
			g.WorkflowInstanceId != w.WorkflowInstanceId || g.TaskId == "" || g.StartTime == 0 ||
			retriesAllowed(&g) != retriesAllowed(&w) {
			t.Fatalf("task %d: %+v\nwant the fields of %+v", i, g, w)
		}
	}
}

// BenchmarkWorkflowDecode: a workflow with its tasks decoded whole into
// the SDK's model (what Client.Workflow with includeTasks does) and as
// the adopter reads it (Client.WorkflowTasks).
func BenchmarkWorkflowDecode(b *testing.B) {
	body := workflowWithTasks(b)
	b.Run("sdk-model", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var wf model.Workflow
			if err := json.Unmarshal(body, &wf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("adopter", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var wt workflowTasks
			if err := json.Unmarshal(body, &wt); err != nil {
				b.Fatal(err)
			}
			_ = wt.workflow()
		}
	})
}
