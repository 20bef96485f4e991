package provision

import (
	"path"
	"slices"
)

// configReaders is, per directory under /home/dev, every file an agent reads
// from that directory as its own configuration. Once provisioning writes a
// merged config into one of these directories, the other files listed for it
// would be read as well and shadow (or mix into) the merged file, so they are
// removed from the VM.
//
// Sources, checked for the versions current in 2026:
//   - .config/opencode: sst/opencode packages/opencode/src/config/config.ts,
//     the global config loader merges config.json, then opencode.json, then
//     opencode.jsonc from Global.Path.config ($XDG_CONFIG_HOME/opencode), and
//     imports a legacy TOML file named "config" there, rewriting it as
//     config.json.
//   - .claude: Claude Code's settings documentation
//     (code.claude.com/docs/en/settings): the user scope is
//     ~/.claude/settings.json alone; settings.local.json is a project-scope
//     file (<project>/.claude/settings.local.json), never read from ~/.claude
//     while the working directory is /workspace. ~/.claude.json is the
//     client's state file, outside this directory, and is left alone.
//   - .codex: openai/codex codex-rs/core/src/config_loader: the user layer is
//     $CODEX_HOME/config.toml; managed_config.toml is read from /etc/codex on
//     Unix, not from $CODEX_HOME.
func configReaders() map[string][]string {
	return map[string][]string{
		".config/opencode": {"config", "config.json", "opencode.json", "opencode.jsonc"},
		".claude":          {"settings.json"},
		".codex":           {"config.toml"},
	}
}

// Shadowed returns the files (relative to /home/dev, slash-separated, sorted)
// that the agent reading configPath would also read from the same directory,
// and that therefore must not exist next to a merged config. It is empty for
// a directory the table does not know (custom agents).
func Shadowed(configPath string) []string {
	dir, name := path.Split(path.Clean(configPath))
	var out []string
	for _, f := range configReaders()[path.Clean(dir)] {
		if f != name {
			out = append(out, path.Join(dir, f))
		}
	}
	slices.Sort(out)
	return out
}
