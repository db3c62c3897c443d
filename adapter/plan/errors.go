package plan

import (
	"errors"
	"fmt"
	"strings"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// Machine codes of plan errors. CodePlanInvalid is the code of the whole
// error (ValidationError.Code); the others are Problem codes.
const (
	// CodePlanInvalid: the plan could not be parsed or failed validation.
	CodePlanInvalid = "PLAN_INVALID"
	// CodeTaskInputInvalid: a Conductor task's input is not what Compile
	// produces (DecodeTaskInput).
	CodeTaskInputInvalid = "TASK_INPUT_INVALID"

	// CodeSyntax: the document is not well-formed JSON or YAML, or it has
	// YAML features the plan format refuses (aliases, merge keys, tags,
	// several documents).
	CodeSyntax = "SYNTAX"
	// CodeTooLarge: the document, a step or a field is over its size limit.
	CodeTooLarge = "TOO_LARGE"
	// CodeUnknownField: a field that the format does not have, including a
	// known name in another case ("stepID").
	CodeUnknownField = "UNKNOWN_FIELD"
	// CodeDuplicateKey: the same key twice in one object.
	CodeDuplicateKey = "DUPLICATE_KEY"
	// CodeBadType: a value of the wrong JSON type (a string for a number,
	// a fraction for an integer, null in a list).
	CodeBadType = "BAD_TYPE"

	// CodeBadID: planId, planVersion or a stepId is empty, longer than
	// statestore.MaxIDBytes, not UTF-8, or contains '|' or NUL.
	CodeBadID = "BAD_ID"
	// CodeBadDescription: the description is too long or not UTF-8.
	CodeBadDescription = "BAD_DESCRIPTION"
	// CodeBadPolicy: onStepFailure is not "", "fail" or "pause".
	CodeBadPolicy = "BAD_POLICY"
	// CodeNoSteps: the plan has no step.
	CodeNoSteps = "NO_STEPS"
	// CodeTooManySteps: the plan has more than MaxSteps steps.
	CodeTooManySteps = "TOO_MANY_STEPS"
	// CodeDuplicateStep: two steps have the same stepId.
	CodeDuplicateStep = "DUPLICATE_STEP"
	// CodeUnknownDependency: dependsOn names no step of the plan.
	CodeUnknownDependency = "UNKNOWN_DEPENDENCY"
	// CodeSelfDependency: a step depends on itself.
	CodeSelfDependency = "SELF_DEPENDENCY"
	// CodeDuplicateDependency: a step lists the same dependency twice.
	CodeDuplicateDependency = "DUPLICATE_DEPENDENCY"
	// CodeCycle: the dependencies form a cycle; the message lists it.
	CodeCycle = "CYCLE"
	// CodeBadExecutor: the executor is of an unknown type, sets another
	// executor's field, or has a bad value for one of its own fields.
	CodeBadExecutor = "BAD_EXECUTOR"
	// CodeBadRetries: a retry policy value is out of range.
	CodeBadRetries = "BAD_RETRIES"
	// CodeBadSecret: a secret reference is malformed or duplicated, or a
	// ${secret:NAME} placeholder names no declared secret.
	CodeBadSecret = "BAD_SECRET"
	// CodeBadTimeout: timeoutSeconds is negative or over MaxTimeoutSeconds.
	CodeBadTimeout = "BAD_TIMEOUT"
	// CodeBadJoin: a join policy that is unknown, on a step with fewer
	// than two dependencies, over a dependency other steps also depend
	// on, or under onStepFailure "pause".
	CodeBadJoin = "BAD_JOIN"
	// CodeTooManyProblems: more problems were found than are reported.
	CodeTooManyProblems = "TOO_MANY_PROBLEMS"
)

// MaxProblems caps the problems one ValidationError reports; one more
// problem with code TOO_MANY_PROBLEMS says that some were left out.
const MaxProblems = 100

// Problem is one thing wrong with a plan (or a task input).
type Problem struct {
	// Code is a machine code such as DUPLICATE_STEP (the Code* constants).
	Code string `json:"code"`
	// Path locates the offending value in the plan's JSON, e.g.
	// "steps[2].dependsOn[0]" or `steps[0].executor.headers["X-Token"]`;
	// "" means the whole document.
	Path string `json:"path,omitempty"`
	// StepID is the stepId of the step the problem is in, when known.
	StepID string `json:"stepId,omitempty"`
	// Message says what is wrong, for people.
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Code + ": " + p.Message
	}
	return p.Path + ": " + p.Code + ": " + p.Message
}

// ValidationError is every problem found in a plan (Code PLAN_INVALID) or
// in a task input (Code TASK_INPUT_INVALID). Parse, Validate, Compile and
// DecodeTaskInput return it as *ValidationError.
type ValidationError struct {
	Code     string    `json:"code"`
	Problems []Problem `json:"problems"`
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	what := "plan"
	if errors.Is(e, ErrTaskInputInvalid) {
		what = "task input"
	}
	switch n := len(e.Problems); n {
	case 0:
		fmt.Fprintf(&b, "%s invalid", what)
	case 1:
		fmt.Fprintf(&b, "%s invalid: %s", what, e.Problems[0])
	default:
		fmt.Fprintf(&b, "%s invalid: %d problems: ", what, n)
		for i, p := range e.Problems {
			if i == 5 {
				fmt.Fprintf(&b, "; and %d more", n-i)
				break
			}
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(p.String())
		}
	}
	return b.String()
}

// ErrorCode returns e.Code (PLAN_INVALID or TASK_INPUT_INVALID).
func (e *ValidationError) ErrorCode() string { return e.Code }

// ErrorKind returns errcode.Invalid: every code of a ValidationError is
// a malformed input.
func (e *ValidationError) ErrorKind() errcode.Kind { return errcode.Invalid }

// Is matches any *ValidationError with the same Code, so that
// errors.Is(err, plan.ErrInvalid) works on every plan error, and
// errcode.Invalid.
func (e *ValidationError) Is(target error) bool { return errcode.Match(e, target) }

// Has reports whether e has a problem with the given code and path.
func (e *ValidationError) Has(code, path string) bool {
	for _, p := range e.Problems {
		if p.Code == code && p.Path == path {
			return true
		}
	}
	return false
}

// Sentinel errors, matched with errors.Is.
var (
	// ErrInvalid matches every PLAN_INVALID error.
	ErrInvalid = &ValidationError{Code: CodePlanInvalid}
	// ErrTaskInputInvalid matches every TASK_INPUT_INVALID error.
	ErrTaskInputInvalid = &ValidationError{Code: CodeTaskInputInvalid}
)

// problems collects Problems up to MaxProblems.
type problems struct {
	list    []Problem
	dropped int
}

func (ps *problems) add(code, path, stepID, format string, args ...any) {
	if len(ps.list) >= MaxProblems {
		ps.dropped++
		return
	}
	ps.list = append(ps.list, Problem{Code: code, Path: path, StepID: stepID, Message: fmt.Sprintf(format, args...)})
}

// err returns nil when nothing was found, else a *ValidationError.
func (ps *problems) err(code string) error {
	if len(ps.list) == 0 {
		return nil
	}
	list := ps.list
	if ps.dropped > 0 {
		list = append(list, Problem{Code: CodeTooManyProblems, Message: fmt.Sprintf("%d more problems not reported", ps.dropped)})
	}
	return &ValidationError{Code: code, Problems: list}
}

// CodeMissingField: a task input key is missing or null.
const CodeMissingField = "MISSING_FIELD"
