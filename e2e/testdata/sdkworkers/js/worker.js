// A worker written with the official JavaScript SDK
// (@io-orkes/conductor-javascript), set up as its README shows, run by the
// end-to-end tests through the task proxy.
//
// Environment: CONDUCTOR_SERVER_URL (the proxy's .../api, read by the SDK
// itself), TASK_TYPE, DOMAIN, THREADS. A task sleeps its input's sleepMs
// (default 0), then completes with {"by": "js"}.
const { OrkesClients, TaskHandler } = require("@io-orkes/conductor-javascript");

async function main() {
  const clients = await OrkesClients.from();
  const handler = new TaskHandler({
    client: clients.getClient(),
    scanForDecorated: false,
    workers: [{
      taskDefName: process.env.TASK_TYPE,
      domain: process.env.DOMAIN || undefined,
      concurrency: Number(process.env.THREADS || "4"),
      pollInterval: 100,
      execute: async (task) => {
        const ms = Number((task.inputData || {}).sleepMs || "0");
        await new Promise((r) => setTimeout(r, ms));
        return { status: "COMPLETED", outputData: { by: "js" } };
      },
    }],
  });
  await handler.startWorkers();
  console.log(`js worker polling ${process.env.TASK_TYPE} at ${process.env.CONDUCTOR_SERVER_URL}`);
}

main().catch((e) => { console.error(e); process.exit(1); });
