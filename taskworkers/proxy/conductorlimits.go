package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// What Conductor refuses, or fails, in an update of a run's task. The
// proxy records an outcome before it forwards the update, so an update
// Conductor would not take as sent must be known before: otherwise the log
// would keep an outcome Conductor never had.
const (
	// MaxNesting is the deepest JSON Conductor's parser takes (Jackson's
	// StreamReadConstraints: 1000); a deeper body is answered 500 there.
	MaxNesting = 1000
	// DefaultMaxTaskOutputBytes is Conductor's
	// conductor.app.maxTaskOutputPayloadSizeThreshold by default (10240
	// KB): a COMPLETED update whose output is larger fails the task there
	// (FAILED_WITH_TERMINAL_ERROR), and its workflow.
	DefaultMaxTaskOutputBytes = 10240 << 10
)

// nesting returns how deep the JSON value b nests objects and arrays (the
// outermost counts 1, as Conductor's parser counts). b is well-formed.
func nesting(b []byte) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// outputTooLarge reports whether Conductor fails res as too large: its
// output, as Conductor serializes it (compact JSON), is over max bytes.
// body is the update as sent (no shorter than the output compacted).
func outputTooLarge(body []byte, res *model.TaskResult, max int64) (int, bool) {
	if max <= 0 || int64(len(body)) <= max || res.Status == model.InProgressTask {
		return 0, false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(res.OutputData); err != nil {
		return 0, false
	}
	n := len(bytes.TrimSpace(buf.Bytes()))
	return n, int64(n) > max
}

// tooLargeResult is the outcome Conductor gives an update whose output is
// n bytes, over max: the task failed for good, with Conductor's reason.
func tooLargeResult(res *model.TaskResult, t *model.Task, n int, max int64) *model.TaskResult {
	failed := *res
	failed.Status = model.FailedWithTerminalErrorTask
	failed.ReasonForIncompletion = fmt.Sprintf("The payload size: %d of task: %s in workflow: %s is greater than the permissible limit: %d bytes (Conductor's maxTaskOutputPayloadSizeThreshold)",
		n, t.TaskId, t.WorkflowInstanceId, max)
	return &failed
}
