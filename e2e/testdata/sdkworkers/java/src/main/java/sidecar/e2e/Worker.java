package sidecar.e2e;

import java.util.List;
import java.util.Map;

import com.netflix.conductor.client.automator.TaskRunnerConfigurer;
import com.netflix.conductor.client.http.ConductorClient;
import com.netflix.conductor.client.http.TaskClient;
import com.netflix.conductor.common.metadata.tasks.Task;
import com.netflix.conductor.common.metadata.tasks.TaskResult;

/**
 * A worker written with the official Java client, configured as its README
 * shows, run by the end-to-end tests through the task proxy. Environment:
 * SERVER_URL (the proxy), TASK_TYPE, DOMAIN, THREADS. A task sleeps its
 * input's sleepMs (default 0), then completes with {"by": "java"}.
 */
public class Worker implements com.netflix.conductor.client.worker.Worker {
    private final String taskType;

    Worker(String taskType) {
        this.taskType = taskType;
    }

    @Override
    public String getTaskDefName() {
        return taskType;
    }

    @Override
    public int getPollingInterval() {
        return 100;
    }

    @Override
    public TaskResult execute(Task task) {
        Object ms = task.getInputData().get("sleepMs");
        if (ms != null) {
            try {
                Thread.sleep(Long.parseLong(ms.toString()));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        TaskResult r = new TaskResult(task);
        r.setStatus(TaskResult.Status.COMPLETED);
        r.getOutputData().put("by", "java");
        return r;
    }

    public static void main(String[] args) throws Exception {
        String url = System.getenv("SERVER_URL");
        String taskType = System.getenv("TASK_TYPE");
        String domain = System.getenv("DOMAIN");
        int threads = Integer.parseInt(System.getenv().getOrDefault("THREADS", "4"));
        ConductorClient client = ConductorClient.builder().basePath(url).build();
        TaskClient tasks = new TaskClient(client);
        TaskRunnerConfigurer.Builder b = new TaskRunnerConfigurer.Builder(tasks, List.of(new Worker(taskType)))
                .withThreadCount(threads);
        if (domain != null && !domain.isEmpty()) {
            b.withTaskToDomain(Map.of(taskType, domain));
        }
        TaskRunnerConfigurer runner = b.build();
        runner.init();
        System.out.println("java worker polling " + taskType + " in domain " + domain + " at " + url);
        Thread.currentThread().join();
    }
}
