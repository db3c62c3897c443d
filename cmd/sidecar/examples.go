package main

// examples are the examples each command's -h prints, by flag set name.
var examples = map[string]string{
	"serve": `  sidecar serve --conductor-url http://127.0.0.1:8080/api --data-dir ./data
  sidecar serve --log-format console --listen 127.0.0.1:8787
`,
	"run submit": `  sidecar run submit deploy/local/plans/diamond.yaml
  sidecar run submit deploy/local/plans/diamond.yaml -l team=data,tier=gold
  sidecar run submit plan.yaml -l team=data -l tier=gold -o name
`,
	"status": `  sidecar status RUN_ID
  sidecar status RUN_ID -o yaml
`,
	"runs": `  sidecar runs
  sidecar runs -l team=data --status RUNNING,PAUSED -o wide
  sidecar runs --draining -w
  sidecar runs -l 'tier in (gold,silver)' -o name --no-headers
`,
	"events": `  sidecar events RUN_ID
  sidecar events RUN_ID --follow -o json
`,
	"audit": `  sidecar audit RUN_ID
  sidecar audit -l team=data --since 24h
`,
	"pause": `  sidecar pause RUN_ID --reason "db maintenance"
  sidecar pause RUN_ID --reason "db maintenance" --timeout 10m --for 1h --wait
  sidecar pause -l team=data --dry-run
  sidecar pause -l team=data --reason "db maintenance" --wait
`,
	"resume": `  sidecar resume RUN_ID --reason "maintenance over"
  sidecar resume -l team=data --reason "maintenance over" --max-rate 10/s
`,
	"cancel": `  sidecar cancel RUN_ID --reason "bad input"
  sidecar cancel --plan etl --dry-run
`,
	"retry": `  sidecar retry RUN_ID load --reason "warehouse back up"
`,
	"bus": `  sidecar bus
  sidecar bus deadletters --sink audit
  sidecar bus replay --sink audit
`,
	"token new": `  sidecar token new --name alice --roles operator
  sidecar token new --name ci --roles submitter --tenant-id acme
`,
	"completion": `  source <(sidecar completion bash)
  sidecar completion zsh > "${fpath[1]}/_sidecar"
`,
}
