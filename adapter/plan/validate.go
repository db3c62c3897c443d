package plan

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// HTTPMethods are the methods an http executor may use.
var HTTPMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}

// Validate checks p against every rule of the plan format (docs/plans.md)
// and returns nil or a *ValidationError with code PLAN_INVALID listing all
// problems found (up to MaxProblems), each with a machine code and the JSON
// path of the offending value. Defaults need not be applied first: a zero
// value means its default. Validate does not change p.
func Validate(p *Plan) error {
	var ps problems
	validatePlan(p, &ps)
	return ps.err(CodePlanInvalid)
}

func validatePlan(p *Plan, ps *problems) {
	if p == nil {
		ps.add(CodeNoSteps, "", "", "the plan is missing")
		return
	}
	checkID(ps, "planId", "", p.PlanID)
	checkID(ps, "planVersion", "", p.PlanVersion)
	switch {
	case len(p.Description) > MaxDescriptionBytes:
		ps.add(CodeBadDescription, "description", "", "is %d bytes; the limit is %d", len(p.Description), MaxDescriptionBytes)
	case !utf8.ValidString(p.Description):
		ps.add(CodeBadDescription, "description", "", "is not valid UTF-8")
	}
	switch p.OnStepFailure {
	case "", OnFailureFail, OnFailurePause:
	default:
		ps.add(CodeBadPolicy, "onStepFailure", "", "must be %q or %q (default %q), got %q", OnFailureFail, OnFailurePause, DefaultOnStepFailure, p.OnStepFailure)
	}
	switch n := len(p.Steps); {
	case n == 0:
		ps.add(CodeNoSteps, "steps", "", "the plan needs at least one step")
		return
	case n > MaxSteps:
		ps.add(CodeTooManySteps, "steps", "", "the plan has %d steps; the limit is %d", n, MaxSteps)
	}

	index := make(map[string]int, len(p.Steps))
	for i := range p.Steps {
		s := &p.Steps[i]
		path := fmt.Sprintf("steps[%d]", i)
		if checkID(ps, path+".stepId", s.StepID, s.StepID) {
			if j, dup := index[s.StepID]; dup {
				ps.add(CodeDuplicateStep, path+".stepId", s.StepID, "the stepId %q is also the stepId of steps[%d]", s.StepID, j)
			} else {
				index[s.StepID] = i
			}
		}
	}
	deps := make([][]int, len(p.Steps)) // deps[i]: indexes step i depends on
	for i := range p.Steps {
		s := &p.Steps[i]
		path := fmt.Sprintf("steps[%d]", i)
		validateStep(ps, s, path)
		seen := make(map[string]bool, len(s.DependsOn))
		for k, d := range s.DependsOn {
			dpath := fmt.Sprintf("%s.dependsOn[%d]", path, k)
			j, known := index[d]
			switch {
			case d == "":
				ps.add(CodeUnknownDependency, dpath, s.StepID, "is empty")
			case d == s.StepID:
				ps.add(CodeSelfDependency, dpath, s.StepID, "the step depends on itself")
			case seen[d]:
				ps.add(CodeDuplicateDependency, dpath, s.StepID, "%q is listed twice", d)
			case !known:
				ps.add(CodeUnknownDependency, dpath, s.StepID, "%q is not a stepId of this plan", d)
			default:
				deps[i] = append(deps[i], j)
			}
			seen[d] = true
		}
	}
	if len(p.Steps) <= MaxSteps {
		reportCycles(ps, p, deps)
	}
	validateJoins(p, ps)
}

// validateJoins checks the join policies. A dependency of a step joined
// with all_done or any_success becomes an optional task in Conductor,
// whose failure nothing else may depend on: it must have no other
// dependent, and the plan must fail rather than pause on a failed step.
func validateJoins(p *Plan, ps *problems) {
	users := map[string]int{}
	for _, s := range p.Steps {
		for _, d := range s.DependsOn {
			users[d]++
		}
	}
	for i, s := range p.Steps {
		path := fmt.Sprintf("steps[%d].join", i)
		switch s.Join {
		case "", JoinAllSuccess:
			continue
		case JoinAllDone, JoinAnySuccess:
		default:
			ps.add(CodeBadJoin, path, s.StepID, "must be %q, %q or %q (default %q), got %q", JoinAllSuccess, JoinAllDone, JoinAnySuccess, JoinAllSuccess, s.Join)
			continue
		}
		if len(s.DependsOn) < 2 {
			ps.add(CodeBadJoin, path, s.StepID, "a join needs two dependencies or more; the step has %d", len(s.DependsOn))
		}
		if p.OnStepFailure == OnFailurePause {
			ps.add(CodeBadJoin, path, s.StepID, "%q needs onStepFailure %q: under %q a failed dependency pauses the run instead of reaching the join", s.Join, OnFailureFail, OnFailurePause)
		}
		for _, d := range s.DependsOn {
			if users[d] > 1 {
				ps.add(CodeBadJoin, path, s.StepID, "dependency %q has other dependents; under %q its failure is let through, which they must not see: give them their own step, or join with %q", d, s.Join, JoinAllSuccess)
			}
		}
	}
}

// checkID reports an identifier that the event contract would refuse. It
// returns whether v is valid.
func checkID(ps *problems, path, stepID, v string) bool {
	if err := statestore.CheckID(v, true); err != nil {
		field := path[strings.LastIndexByte(path, '.')+1:]
		ps.add(CodeBadID, path, stepID, "%s %v", field, err)
		return false
	}
	return true
}

// reportCycles reports one CYCLE problem per strongly connected component
// of more than one step (Tarjan), naming one cycle through it.
func reportCycles(ps *problems, p *Plan, deps [][]int) {
	n := len(deps)
	idx := make([]int, n)
	low := make([]int, n)
	on := make([]bool, n)
	for i := range idx {
		idx[i] = -1
	}
	var stack []int
	next := 0
	var strong func(v int)
	strong = func(v int) {
		idx[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, w := range deps[v] {
			if idx[w] < 0 {
				strong(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], idx[w])
			}
		}
		if low[v] != idx[v] {
			return
		}
		var comp []int
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 {
			reportCycle(ps, p, deps, comp)
		}
	}
	for v := 0; v < n; v++ {
		if idx[v] < 0 {
			strong(v)
		}
	}
}

// reportCycle finds a shortest cycle through the lowest-index step of the
// component comp (breadth-first within comp) and reports it.
func reportCycle(ps *problems, p *Plan, deps [][]int, comp []int) {
	in := make(map[int]bool, len(comp))
	start := comp[0]
	for _, v := range comp {
		in[v] = true
		start = min(start, v)
	}
	prev := map[int]int{}
	queue := []int{start}
	var last = -1
	for len(queue) > 0 && last < 0 {
		v := queue[0]
		queue = queue[1:]
		for _, w := range deps[v] {
			if !in[w] {
				continue
			}
			if w == start {
				last = v
				break
			}
			if _, seen := prev[w]; !seen {
				prev[w] = v
				queue = append(queue, w)
			}
		}
	}
	if last < 0 { // unreachable: a strongly connected component has a cycle through each member
		ps.add(CodeCycle, fmt.Sprintf("steps[%d].dependsOn", start), p.Steps[start].StepID, "the step is part of a dependency cycle")
		return
	}
	// Walk back from last to start: start -> ... -> last -> start.
	cycle := []int{start}
	for v := last; v != start; v = prev[v] {
		cycle = append(cycle, v)
	}
	// cycle is start, last, ..., second; reverse all but the first.
	for i, j := 1, len(cycle)-1; i < j; i, j = i+1, j-1 {
		cycle[i], cycle[j] = cycle[j], cycle[i]
	}
	names := make([]string, 0, len(cycle)+1)
	for _, v := range cycle {
		names = append(names, strconv.Quote(p.Steps[v].StepID))
	}
	names = append(names, strconv.Quote(p.Steps[start].StepID))
	first := cycle[0]
	second := start
	if len(cycle) > 1 {
		second = cycle[1]
	}
	k := indexOf(p.Steps[first].DependsOn, p.Steps[second].StepID)
	ps.add(CodeCycle, fmt.Sprintf("steps[%d].dependsOn[%d]", first, k), p.Steps[first].StepID,
		"dependency cycle: %s (each step depends on the next)", strings.Join(names, " -> "))
}

func indexOf(list []string, v string) int {
	for i, s := range list {
		if s == v {
			return i
		}
	}
	return 0
}

// validateStep checks one step's own fields: everything but stepId and
// dependsOn, which need the whole plan.
func validateStep(ps *problems, s *Step, path string) {
	id := s.StepID
	timeout := s.TimeoutSeconds
	switch {
	case timeout < 0 || timeout > MaxTimeoutSeconds:
		ps.add(CodeBadTimeout, path+".timeoutSeconds", id, "must be between 0 (the default, %d) and %d, got %d", DefaultTimeoutSeconds, MaxTimeoutSeconds, timeout)
		timeout = -1
	case timeout == 0:
		timeout = DefaultTimeoutSeconds
	}
	r := s.Retries
	if r.EngineTries < 0 || r.EngineTries > MaxEngineTries {
		ps.add(CodeBadRetries, path+".retries.engineTries", id, "must be between 0 (meaning 1) and %d, got %d", MaxEngineTries, r.EngineTries)
	}
	if r.LogicalAttempts < 0 || r.LogicalAttempts > MaxLogicalAttempts {
		ps.add(CodeBadRetries, path+".retries.logicalAttempts", id, "must be between 0 (meaning 1) and %d, got %d", MaxLogicalAttempts, r.LogicalAttempts)
	}
	if r.DelaySeconds < 0 || r.DelaySeconds > MaxRetryDelaySeconds {
		ps.add(CodeBadRetries, path+".retries.delaySeconds", id, "must be between 0 and %d, got %d", MaxRetryDelaySeconds, r.DelaySeconds)
	}
	secrets := validateSecrets(ps, s, path)
	validateExecutor(ps, s, path, timeout, secrets)
	if b, err := json.Marshal(s); err == nil && len(b) > MaxStepBytes {
		ps.add(CodeTooLarge, path, id, "the step is %d bytes in JSON; the limit is %d", len(b), MaxStepBytes)
	}
}

// validateSecrets checks the secret references and returns the declared
// names.
func validateSecrets(ps *problems, s *Step, path string) map[string]bool {
	names := make(map[string]bool, len(s.Secrets))
	for k, sr := range s.Secrets {
		spath := fmt.Sprintf("%s.secrets[%d]", path, k)
		switch {
		case !isEnvName(sr.Name) || len(sr.Name) > MaxSecretNameBytes:
			ps.add(CodeBadSecret, spath+".name", s.StepID, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most %d bytes), got %q", MaxSecretNameBytes, sr.Name)
		case names[sr.Name]:
			ps.add(CodeBadSecret, spath+".name", s.StepID, "the secret %q is declared twice", sr.Name)
		default:
			names[sr.Name] = true
		}
		if msg := checkSecretRef(sr.Ref); msg != "" {
			ps.add(CodeBadSecret, spath+".ref", s.StepID, "%s", msg)
		}
	}
	return names
}

func checkSecretRef(ref string) string {
	const want = `must be "env:VAR" or "file:/absolute/path"`
	switch {
	case strings.HasPrefix(ref, "env:"):
		if v := ref[len("env:"):]; !isEnvName(v) {
			return fmt.Sprintf("%s; %q is not an environment variable name", want, v)
		}
	case strings.HasPrefix(ref, "file:"):
		if msg := checkAbsPath(ref[len("file:"):]); msg != "" {
			return want + "; the path " + msg
		}
	default:
		return fmt.Sprintf("%s, got %q", want, ref)
	}
	return ""
}

// checkAbsPath returns why p is not an acceptable absolute path, or "".
func checkAbsPath(p string) string {
	switch {
	case !filepath.IsAbs(p):
		return "must be absolute"
	case len(p) > MaxPathBytes:
		return fmt.Sprintf("is over %d bytes", MaxPathBytes)
	case strings.IndexByte(p, 0) >= 0:
		return "must not contain NUL"
	case !utf8.ValidString(p):
		return "is not valid UTF-8"
	}
	return ""
}

// isEnvName reports whether s is a portable environment variable name.
func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// field names of each executor, for the "only its own fields" rule.
func executorFields(e *ExecutorSpec) []struct {
	name, owner string
	set         bool
} {
	return []struct {
		name, owner string
		set         bool
	}{
		{"argv", ExecutorCommand, e.Argv != nil},
		{"env", ExecutorCommand, e.Env != nil},
		{"workingDir", ExecutorCommand, e.WorkingDir != ""},
		{"method", ExecutorHTTP, e.Method != ""},
		{"url", ExecutorHTTP, e.URL != ""},
		{"headers", ExecutorHTTP, e.Headers != nil},
		{"body", ExecutorHTTP, e.Body != ""},
		{"retryableStatus", ExecutorHTTP, e.RetryableStatus != nil},
		{"seconds", ExecutorSleep, e.Seconds != 0},
		{"taskType", ExecutorExternal, e.TaskType != ""},
		{"input", ExecutorExternal, e.Input != nil},
	}
}

func validateExecutor(ps *problems, s *Step, path string, timeout int64, secrets map[string]bool) {
	e := &s.Executor
	ep := path + ".executor"
	id := s.StepID
	switch e.Type {
	case ExecutorCommand, ExecutorHTTP, ExecutorNoop, ExecutorSleep, ExecutorExternal:
	case "":
		ps.add(CodeBadExecutor, ep+".type", id, "is required: one of command, http, noop, sleep, external")
		return
	default:
		ps.add(CodeBadExecutor, ep+".type", id, "unknown executor type %q: one of command, http, noop, sleep, external", e.Type)
		return
	}
	for _, f := range executorFields(e) {
		if f.set && f.owner != e.Type {
			ps.add(CodeBadExecutor, ep+"."+f.name, id, "%s is a field of the %s executor, not of %s", f.name, f.owner, e.Type)
		}
	}
	switch e.Type {
	case ExecutorCommand:
		validateCommand(ps, e, ep, id, secrets)
	case ExecutorHTTP:
		validateHTTP(ps, e, ep, id, secrets)
	case ExecutorExternal:
		validateExternal(ps, s, ep)
	case ExecutorSleep:
		switch {
		case !(e.Seconds > 0) || math.IsInf(e.Seconds, 0):
			ps.add(CodeBadExecutor, ep+".seconds", id, "must be a number of seconds > 0, got %v", e.Seconds)
		case timeout > 0 && e.Seconds >= float64(timeout):
			ps.add(CodeBadExecutor, ep+".seconds", id, "must be less than the step's timeout (%d s), got %v", timeout, e.Seconds)
		}
	}
}

func validateCommand(ps *problems, e *ExecutorSpec, ep, id string, secrets map[string]bool) {
	if len(e.Argv) == 0 {
		ps.add(CodeBadExecutor, ep+".argv", id, "needs at least the program to run")
	}
	for i, a := range e.Argv {
		switch {
		case i == 0 && a == "":
			ps.add(CodeBadExecutor, ep+".argv[0]", id, "the program must not be empty")
		case strings.IndexByte(a, 0) >= 0:
			ps.add(CodeBadExecutor, fmt.Sprintf("%s.argv[%d]", ep, i), id, "must not contain NUL")
		}
	}
	for _, k := range sortedKeys(e.Env) {
		kp := ep + ".env[" + strconv.Quote(k) + "]"
		switch {
		case !isEnvName(k):
			ps.add(CodeBadExecutor, kp, id, "%q is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		case secrets[k]:
			ps.add(CodeBadExecutor, kp, id, "%q is also the name of a secret of the step, which sets it", k)
		case strings.IndexByte(e.Env[k], 0) >= 0:
			ps.add(CodeBadExecutor, kp, id, "the value must not contain NUL")
		}
	}
	if e.WorkingDir != "" {
		if msg := checkAbsPath(e.WorkingDir); msg != "" {
			ps.add(CodeBadExecutor, ep+".workingDir", id, "%s", msg)
		}
	}
}

func validateHTTP(ps *problems, e *ExecutorSpec, ep, id string, secrets map[string]bool) {
	// Left out, the method is GET; the executor upper-cases it.
	if m := strings.ToUpper(e.Method); m != "" && !slices.Contains(HTTPMethods, m) {
		ps.add(CodeBadExecutor, ep+".method", id, "must be one of %s (any case; default GET), got %q", strings.Join(HTTPMethods, ", "), e.Method)
	}
	if e.URL == "" {
		ps.add(CodeBadExecutor, ep+".url", id, "is required")
	} else if checkPlaceholders(ps, e.URL, ep+".url", id, secrets) {
		u, err := url.Parse(fillPlaceholders(e.URL))
		switch {
		case err != nil:
			ps.add(CodeBadExecutor, ep+".url", id, "is not a URL: %v", stripURLError(err))
		case u.Scheme != "http" && u.Scheme != "https":
			ps.add(CodeBadExecutor, ep+".url", id, "must be an absolute http or https URL")
		case u.Host == "":
			ps.add(CodeBadExecutor, ep+".url", id, "has no host")
		}
	}
	for _, k := range sortedKeys(e.Headers) {
		kp := ep + ".headers[" + strconv.Quote(k) + "]"
		v := e.Headers[k]
		switch {
		case !isToken(k):
			ps.add(CodeBadExecutor, kp, id, "%q is not a valid header name", k)
		case strings.ContainsAny(v, "\r\n\x00"):
			ps.add(CodeBadExecutor, kp, id, "the value must not contain CR, LF or NUL")
		default:
			checkPlaceholders(ps, v, kp, id, secrets)
		}
	}
	checkPlaceholders(ps, e.Body, ep+".body", id, secrets)
	for i, c := range e.RetryableStatus {
		if c < 400 || c > 599 {
			ps.add(CodeBadExecutor, fmt.Sprintf("%s.retryableStatus[%d]", ep, i), id, "must be an HTTP error status (400-599), got %d", c)
		}
	}
}

func stripURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// placeholderPrefix starts a secret placeholder ${secret:NAME} in an http
// executor's url, header values and body.
const placeholderPrefix = "${secret:"

// Placeholders returns the secret names that s refers to with
// ${secret:NAME}, in order, and whether every placeholder is well-formed
// (NAME an environment variable name, closed by '}').
func Placeholders(s string) (names []string, ok bool) {
	ok = true
	for {
		i := strings.Index(s, placeholderPrefix)
		if i < 0 {
			return names, ok
		}
		s = s[i+len(placeholderPrefix):]
		j := strings.IndexByte(s, '}')
		if j < 0 || !isEnvName(s[:j]) {
			ok = false
			continue
		}
		names = append(names, s[:j])
		s = s[j+1:]
	}
}

// checkPlaceholders reports malformed placeholders and those naming no
// declared secret; it returns whether all are fine.
func checkPlaceholders(ps *problems, s, path, id string, secrets map[string]bool) bool {
	names, ok := Placeholders(s)
	if !ok {
		ps.add(CodeBadSecret, path, id, "has a malformed placeholder: write ${secret:NAME} with NAME a declared secret")
	}
	for _, n := range names {
		if !secrets[n] {
			ps.add(CodeBadSecret, path, id, "the placeholder ${secret:%s} names no secret of the step", n)
			ok = false
		}
	}
	return ok
}

// fillPlaceholders replaces each placeholder with a neutral word, so that
// the URL around it can be checked.
func fillPlaceholders(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, placeholderPrefix)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		b.WriteString("secret")
		s = s[i+j+1:]
	}
}

// isToken reports whether s is an HTTP token (RFC 9110 field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// ExpandPlaceholders replaces every ${secret:NAME} in s with values[NAME];
// other text, other ${...} included, is kept. It fails, naming no value,
// when a placeholder is unterminated or malformed or its secret has no
// value. It is the one expander: the http executor calls it on the url,
// header values and body right before sending.
func ExpandPlaceholders(s string, values map[string]string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, placeholderPrefix)
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		rest := s[i+len(placeholderPrefix):]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			return "", fmt.Errorf("unterminated ${secret: at byte %d", i)
		}
		if !isEnvName(rest[:j]) {
			return "", fmt.Errorf("malformed placeholder at byte %d: the secret's name must be an environment variable name", i)
		}
		v, ok := values[rest[:j]]
		if !ok {
			return "", fmt.Errorf("references ${secret:%s}, which is not among the step's secrets", rest[:j])
		}
		b.WriteString(s[:i])
		b.WriteString(v)
		s = rest[j+1:]
	}
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

// MaxTaskTypeBytes bounds an external step's taskType.
const MaxTaskTypeBytes = 128

// validateExternal checks an external step: a taskType Conductor accepts
// that is not one of the sidecar's own, input keys that do not hide the
// sidecar's task input, and no secrets (the outside worker has its own).
func validateExternal(ps *problems, s *Step, ep string) {
	e, id := &s.Executor, s.StepID
	switch {
	case e.TaskType == "":
		ps.add(CodeBadExecutor, ep+".taskType", id, "is required: the Conductor task type the outside worker polls")
	case len(e.TaskType) > MaxTaskTypeBytes || !isTaskTypeName(e.TaskType):
		ps.add(CodeBadExecutor, ep+".taskType", id, "must be 1 to %d bytes of [A-Za-z0-9_-], got %q", MaxTaskTypeBytes, e.TaskType)
	case ExecutorTypeOf(e.TaskType) != "":
		ps.add(CodeBadExecutor, ep+".taskType", id, "%q is a task type of the sidecar's own workers", e.TaskType)
	}
	for _, k := range sortedKeys(e.Input) {
		if reservedInputKey(k) {
			ps.add(CodeBadExecutor, ep+".input["+strconv.Quote(k)+"]", id, "%q is a task input key of the sidecar", k)
		}
	}
	if len(s.Secrets) > 0 {
		ps.add(CodeBadSecret, strings.TrimSuffix(ep, ".executor")+".secrets", id, "an external step takes no secrets: its worker resolves its own")
	}
}

func isTaskTypeName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}

// reservedInputKey reports whether k is a key of the task input the
// compiler writes (WorkflowInputKeys and the step keys).
func reservedInputKey(k string) bool {
	switch k {
	case InputStep, InputEngineTries, InputLogicalAttempts, InputOnStepFailure, InputSink:
		return true
	}
	for _, w := range WorkflowInputKeys {
		if k == w {
			return true
		}
	}
	return false
}
