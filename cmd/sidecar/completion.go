package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// CompletionCommand prints a shell completion script: "sidecar completion
// bash|zsh". The script completes the commands and each command's flags,
// as its "-h" lists them.
type CompletionCommand struct{ m *Main }

// completedCommands are the commands the script completes, with their
// subcommands.
var completedCommands = []struct {
	name string
	subs []string
}{
	{"serve", nil}, {"run", []string{"submit"}}, {"status", nil}, {"runs", nil}, {"events", nil}, {"audit", nil},
	{"pause", nil}, {"resume", nil}, {"cancel", nil}, {"retry", nil}, {"bus", []string{"deadletters", "replay"}},
	{"migrate", nil}, {"verify", nil}, {"demo", nil}, {"key", nil}, {"token", []string{"new"}}, {"version", nil},
	{"completion", []string{"bash", "zsh"}},
}

// Run implements "sidecar completion".
func (c *CompletionCommand) Run(ctx context.Context, args []string) error {
	fs := c.m.newFlagSet("completion", "completion bash|zsh")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "bash" && pos[0] != "zsh") {
		return usageError(fs, "give the shell: bash or zsh")
	}
	if c.m.flagSets != nil { // collecting flags: the completion has none
		return nil
	}
	script := bashCompletion(ctx)
	if pos[0] == "zsh" {
		script = "#compdef sidecar\nautoload -U +X bashcompinit && bashcompinit\n" + script
	}
	_, err = io.WriteString(c.m.Stdout, script)
	return err
}

// commandFlags are the flags of a command (words: "pause", "bus replay"),
// read from the flag sets its -h makes.
func commandFlags(ctx context.Context, words ...string) []string {
	var sets []*flag.FlagSet
	m := &Main{Stdout: io.Discard, Stderr: io.Discard, flagSets: &sets}
	m.Run(ctx, append(append([]string{}, words...), "-h"))
	seen := map[string]bool{}
	var out []string
	for _, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) {
			name := "--" + f.Name
			if len(f.Name) == 1 {
				name = "-" + f.Name
			}
			if !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
		})
	}
	sort.Strings(out)
	return out
}

func bashCompletion(ctx context.Context) string {
	var b strings.Builder
	var names []string
	for _, c := range completedCommands {
		names = append(names, c.name)
	}
	fmt.Fprintf(&b, `# sidecar completion for bash: source <(sidecar completion bash)
_sidecar() {
  local cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} sub=${COMP_WORDS[2]} words=""
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur"))
    return
  fi
  case "$cmd" in
`, strings.Join(names, " "))
	for _, c := range completedCommands {
		if c.name == "completion" {
			fmt.Fprintf(&b, "  completion) words=\"bash zsh\" ;;\n")
			continue
		}
		if len(c.subs) == 0 {
			fmt.Fprintf(&b, "  %s) words=\"%s\" ;;\n", c.name, strings.Join(commandFlags(ctx, c.name), " "))
			continue
		}
		fmt.Fprintf(&b, "  %s)\n    if [[ $COMP_CWORD -eq 2 ]]; then words=\"%s\"; else case \"$sub\" in\n", c.name, strings.Join(c.subs, " "))
		for _, s := range c.subs {
			fmt.Fprintf(&b, "      %s) words=\"%s\" ;;\n", s, strings.Join(commandFlags(ctx, c.name, s), " "))
		}
		if c.name == "bus" { // "sidecar bus" alone has flags too
			fmt.Fprintf(&b, "      *) words=\"%s\" ;;\n", strings.Join(commandFlags(ctx, c.name), " "))
		}
		fmt.Fprintf(&b, "    esac; fi ;;\n")
	}
	b.WriteString(`  esac
  if [[ $cur == -* || $COMP_CWORD -eq 2 && -n $words && $words != -* ]]; then
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
  fi
}
complete -o default -F _sidecar sidecar
`)
	return b.String()
}
