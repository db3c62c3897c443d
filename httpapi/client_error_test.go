package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// An API error with problems reads as lines, one a problem, in the words
// of the message: the problem the message already says is not repeated,
// and no raw JSON is printed (the CLI prints Error() as it is).
func TestError_ProblemsRead(t *testing.T) {
	one := &Error{Status: 400, Code: "PLAN_INVALID", Message: `plan invalid: steps[0].dependsOn[0]: CYCLE: dependency cycle: "a" -> "b" -> "a"`,
		Problems: json.RawMessage(`[{"code":"CYCLE","path":"steps[0].dependsOn[0]","stepId":"a","message":"dependency cycle: \"a\" -\u003e \"b\" -\u003e \"a\""}]`)}
	if got := one.Error(); strings.Contains(got, "\n") || strings.Contains(got, "{") {
		t.Fatalf("one problem the message says: %q, want one line", got)
	}
	two := &Error{Status: 400, Code: "PLAN_INVALID", Message: "plan invalid: steps[0].executor.type: UNKNOWN_EXECUTOR: no executor \"shell\" (and 1 more)",
		Problems: json.RawMessage(`[{"code":"UNKNOWN_EXECUTOR","path":"steps[0].executor.type","message":"no executor \"shell\""},{"code":"DUPLICATE_STEP","path":"steps[2].stepId","message":"step \"b\" twice"}]`)}
	got := two.Error()
	if strings.Contains(got, "{") || !strings.Contains(got, "\n  steps[2].stepId: DUPLICATE_STEP: step \"b\" twice") || strings.Count(got, "UNKNOWN_EXECUTOR") != 1 {
		t.Fatalf("two problems: %q, want the second as a line of its own and no JSON", got)
	}
}
