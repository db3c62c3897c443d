"""A worker written with the official Python SDK (conductor-python), set up
as its README shows, run by the end-to-end tests through the task proxy.

Environment: SERVER_URL (the proxy's .../api), TASK_TYPE, DOMAIN, THREADS.
A task sleeps its input's sleepMs (default 0), then completes with
{"by": "python"}; with failOnceFile it fails instead when that file does
not exist yet, and creates it. The worker's only sidecar-specific setting is SERVER_URL.
"""
import os
import time

from conductor.client.automator.task_handler import TaskHandler
from conductor.client.configuration.configuration import Configuration
from conductor.client.worker.worker_task import worker_task

TASK_TYPE = os.environ["TASK_TYPE"]


@worker_task(task_definition_name=TASK_TYPE, domain=os.environ.get("DOMAIN") or None,
             thread_count=int(os.environ.get("THREADS", "4")), poll_interval_millis=100)
def work(sleepMs: str = "0", failOnceFile: str = "") -> dict:
    time.sleep(int(sleepMs) / 1000.0)
    if failOnceFile and not os.path.exists(failOnceFile):
        # The first task given this input fails; the file says it did.
        open(failOnceFile, "w").close()
        raise Exception("failing once, as asked")
    return {"by": "python"}


def main():
    config = Configuration(server_api_url=os.environ["SERVER_URL"])
    with TaskHandler(configuration=config, scan_for_annotated_workers=True) as handler:
        handler.start_processes()
        print("python worker polling", TASK_TYPE, "at", os.environ["SERVER_URL"], flush=True)
        handler.join_processes()


if __name__ == "__main__":
    main()
