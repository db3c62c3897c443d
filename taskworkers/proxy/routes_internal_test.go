package proxy

import "testing"

// TestRouteOf: the route rule on the paths the SDKs call and on those it
// must refuse (table; the real-Conductor effect is in
// TestProxy_RefusesWhatWorkersDoNotCall).
func TestRouteOf(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         route
	}{
		{"GET", "/api/tasks/poll/t1", routePoll},
		{"GET", "/api/tasks/poll/batch/t1", routeBatchPoll},
		{"GET", "/tasks/poll/batch/t1", routeBatchPoll},
		{"POST", "/api/tasks", routeUpdate},
		{"POST", "/api/tasks/", routeUpdate},
		{"POST", "/api/tasks/update-v2", routeUpdateV2},
		{"POST", "/api/tasks/wf1/ref1/COMPLETED", routeUpdateByRef},
		{"POST", "/api/tasks/wf1/ref1/FAILED/sync", routeUpdateByRef},
		{"GET", "/api/tasks/task1", routeForward},
		{"GET", "/api/tasks/task1/log", routeForward},
		{"POST", "/api/tasks/task1/log", routeForward},
		{"POST", "/api/tasks/task1/ack", routeForward},
		{"GET", "/api/tasks/externalstoragelocation", routeForward},
		{"GET", "/api/metadata/taskdefs", routeForward},
		{"POST", "/api/metadata/taskdefs", routeForward},
		{"PUT", "/api/metadata/taskdefs", routeForward},
		{"GET", "/api/metadata/taskdefs/t1", routeForward},
		{"POST", "/api/token", routeForward},
		{"GET", "/health", routeForward},
		{"GET", "/api/health", routeForward},

		{"DELETE", "/api/metadata/taskdefs/t1", routeRefused},
		{"PUT", "/api/tasks/task1", routeRefused},
		{"GET", "/api/tasks/search", routeRefused},
		{"GET", "/api/tasks/search-v2", routeRefused},
		{"GET", "/api/tasks/queue/all", routeRefused},
		{"POST", "/api/tasks/queue/requeue/COMPLETED", routeRefused},
		{"GET", "/api/tasks/queue/log", routeRefused},
		{"POST", "/api/tasks/wf1/COMPLETED/signal", routeRefused},
		{"GET", "/api/workflow/wf1", routeRefused},
		{"PUT", "/api/workflow/wf1/resume", routeRefused},
		{"DELETE", "/api/workflow/wf1", routeRefused},
		{"POST", "/api/workflow", routeRefused},
		{"GET", "/api/admin/config", routeRefused},
		{"GET", "/admin/config", routeRefused},
		{"GET", "/apiadmin/config", routeRefused},
		{"POST", "/api/tasks/../workflow/COMPLETED", routeRefused},
		{"POST", "/api/tasks/./wf/ref/COMPLETED", routeRefused},
		{"POST", "/api/tasks//ref/COMPLETED", routeRefused},
		{"GET", "/api/tasks/..;/admin", routeRefused},
		{"GET", "/api/tasks/a\\b", routeRefused},
		{"HEAD", "/health", routeRefused},
	} {
		if got := routeOf(c.method, c.path, false); got != c.want {
			t.Errorf("routeOf(%s %s) = %d, want %d", c.method, c.path, got, c.want)
		}
		if got := routeOf(c.method, c.path, true); c.want == routeRefused && got != routeForward {
			t.Errorf("with forwardAll, routeOf(%s %s) = %d, want forward", c.method, c.path, got)
		}
	}
}
