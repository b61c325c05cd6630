/**
 * The docs check (issue 43): what a clone alone must be able to follow.
 *
 * - {@link brokenLinks}: relative Markdown links (`[text](target)`, `[text](target#anchor)`,
 *   `[text](#anchor)`) whose file or heading anchor does not exist. Anchors follow GitHub's
 *   heading slugs (lower case, punctuation dropped, spaces to `-`, `-1`, `-2`… for repeats).
 * - {@link citedPaths} / {@link brokenCitations}: paths cited in code comments (`.ts` comments via
 *   the TypeScript scanner, `#` comments of shell scripts and the Containerfile) that do not exist
 *   in the repository.
 * - {@link importGraph} and {@link parseMermaid}: the folder-level import graph of the sources and
 *   the flowchart of docs/architecture.md, compared by `scripts/architecture.test.ts`.
 *
 * Used by `scripts/docs-check.test.ts` (unit project, so `npm test` and CI run it).
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative, resolve, sep } from 'node:path';
import ts from 'typescript';

/** Absolute path of the repository root. */
export const REPO_ROOT = resolve(dirname(new URL(import.meta.url).pathname), '..');

const SKIP_DIRS = new Set(['node_modules', '.git', 'results', '__snapshots__']);

/**
 * Every file under `dir` (repo-relative, `/`-separated), skipping node_modules, .git, benchmark
 * results and snapshot folders. `dir` is repo-relative; a missing folder gives `[]`.
 */
export function listFiles(dir: string, root = REPO_ROOT): string[] {
  const out: string[] = [];
  const walk = (abs: string): void => {
    if (!existsSync(abs)) return;
    for (const name of readdirSync(abs)) {
      if (SKIP_DIRS.has(name) || name.startsWith('.')) continue;
      const p = join(abs, name);
      if (statSync(p).isDirectory()) walk(p);
      else out.push(relative(root, p).split(sep).join('/'));
    }
  };
  walk(join(root, dir));
  return out.sort();
}

/** `md` with fenced code blocks blanked (same length, newlines kept). */
function withoutFences(md: string): string {
  return md.replace(/^( {0,3})(`{3,}|~{3,})[^\n]*\n[\s\S]*?^\1\2[^\n]*$/gm, (m) => m.replace(/[^\n]/g, ' '));
}

/** `md` with fenced code blocks and inline code spans blanked (same length, newlines kept). */
function withoutCode(md: string): string {
  return withoutFences(md).replace(/(`+)[^`\n][^\n]*?\1/g, (m) => m.replace(/[^\n]/g, ' '));
}

/**
 * GitHub's anchor for a heading text: inline markup removed, lower-cased, every character that is
 * not a letter, digit, space, `-` or `_` dropped, spaces turned into `-`.
 */
export function slug(heading: string): string {
  return heading
    .replace(/`([^`]*)`/g, '$1')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/ /g, '-');
}

/** Every anchor a Markdown page offers: its ATX headings' slugs (repeats get `-1`, `-2`…). */
export function anchors(md: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of withoutFences(md).matchAll(/^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$/gm)) {
    const base = slug(m[1] ?? '');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** One link found in a page: its target as written and its 1-based line. */
export interface MarkdownLink {
  target: string;
  line: number;
}

/** Inline links and images of `md` (outside code), `[text](target "title")` and `<target>` forms. */
export function markdownLinks(md: string): MarkdownLink[] {
  const text = withoutCode(md);
  const out: MarkdownLink[] = [];
  for (const m of text.matchAll(/!?\[[^\]\n]*\]\(\s*(<[^>\n]*>|[^)\s]+)(?:\s+"[^"\n]*")?\s*\)/g)) {
    const raw = (m[1] ?? '').replace(/^<|>$/g, '');
    out.push({ target: raw, line: text.slice(0, m.index).split('\n').length });
  }
  for (const m of text.matchAll(/^ {0,3}\[[^\]\n]+\]:\s*(\S+)/gm)) {
    out.push({ target: m[1] ?? '', line: text.slice(0, m.index).split('\n').length });
  }
  return out;
}

/**
 * Relative links of the Markdown page `page` (repo-relative) whose target file does not exist,
 * or whose `#anchor` is not a heading of the target page. External links (`scheme:`), and links
 * that leave the repository count as broken only in the second case (a page must not point outside
 * its clone). Returns one message per broken link: `page:line: target (why)`.
 */
export function brokenLinks(page: string, root = REPO_ROOT): string[] {
  const md = readFileSync(join(root, page), 'utf8');
  const out: string[] = [];
  for (const { target, line } of markdownLinks(md)) {
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:, …
    const [pathPart = '', anchor] = target.split('#', 2);
    const file =
      pathPart === ''
        ? page
        : normalize(join(dirname(page), decodeURI(pathPart)))
            .split(sep)
            .join('/');
    const where = `${page}:${line}: ${target}`;
    if (file.startsWith('..') || file.startsWith('/')) {
      out.push(`${where} (outside the repository)`);
      continue;
    }
    const abs = join(root, file);
    if (!existsSync(abs)) {
      out.push(`${where} (no such file: ${file})`);
      continue;
    }
    if (anchor !== undefined && anchor !== '') {
      if (!file.endsWith('.md')) continue; // line anchors of source files (#L10) are not checked
      if (!anchors(readFileSync(abs, 'utf8')).has(anchor))
        out.push(`${where} (no heading #${anchor} in ${file})`);
    }
  }
  return out;
}

/** The comments of a source file, each with its 1-based line. Kinds: `.ts` and `#`-comment files. */
export function comments(file: string, text: string): { text: string; line: number }[] {
  const out: { text: string; line: number }[] = [];
  const lineOf = (pos: number): number => text.slice(0, pos).split('\n').length;
  if (file.endsWith('.ts')) {
    const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, false);
    const seen = new Set<number>();
    const take = (ranges: ts.CommentRange[] | undefined): void => {
      for (const r of ranges ?? []) {
        if (seen.has(r.pos)) continue;
        seen.add(r.pos);
        out.push({ text: text.slice(r.pos, r.end), line: lineOf(r.pos) });
      }
    };
    const visit = (node: ts.Node): void => {
      take(ts.getLeadingCommentRanges(text, node.getFullStart()));
      take(ts.getTrailingCommentRanges(text, node.getEnd()));
      ts.forEachChild(node, visit);
    };
    visit(sf);
    take(ts.getLeadingCommentRanges(text, sf.endOfFileToken.getFullStart()));
    return out.sort((x, y) => x.line - y.line);
  }
  text.split('\n').forEach((l, i) => {
    const m = /(?:^|\s)#(?![!{#])(.*)$/.exec(l);
    if (m && !/^\s*#!/.test(l)) out.push({ text: m[1] ?? '', line: i + 1 });
  });
  return out;
}

const topLevels = new Map<string, Set<string>>();

/** The top-level entries of `root` (read once per root). */
function topLevelOf(root: string): Set<string> {
  let t = topLevels.get(root);
  if (!t) {
    t = new Set(readdirSync(root));
    topLevels.set(root, t);
  }
  return t;
}

/** Extensions whose bare names (no `/`) are checked: documents and the repository's code. */
const CHECKED_EXTS = /\.(md|ts|lua|sh)$/;

/**
 * Paths a comment cites, as written: tokens ending in `.md`/`.ts`/`.lua`/`.sh`, with or without a
 * `/`, and other tokens with a `/` whose first segment is a top-level entry of the repository
 * (`runtime/core`), `shared`, or `..`/`.`. Not paths: URLs (and bare `host.tld/…`), absolute
 * paths (`/proc/…`, `~/.space/…`, `$HOME/…`), `node:` modules, npm packages (a first segment found in
 * node_modules), templates (`stacks/Pulumi.<stack>.yaml`), and slash-separated words
 * (`read/write`, `TCP/53`, `application/json`).
 */
export function citedPaths(comment: string, root = REPO_ROOT): string[] {
  const topLevel = topLevelOf(root);
  const text = comment.replace(/\b[a-z][a-z0-9+.-]*:\/\/\S+/gi, ' ');
  const out: string[] = [];
  for (const m of text.matchAll(/(?<![\w.@/:$~<{-])((?:\.{1,2}\/)*[\w@*.-]+(?:\/[\w@*.-]+)*\/?)/g)) {
    if (/^[<{…]/.test(text.slice((m.index ?? 0) + m[0].length))) continue; // a template, not a path
    const token = (m[1] ?? '').replace(/[.,;:]+$/, '').replace(/\/$/, '');
    const hasSlash = token.includes('/');
    const upward = token.startsWith('../') || token.startsWith('./');
    const first = token.replace(/^(\.\.?\/)+/, '').split('/')[0] ?? '';
    if (first === '' || first.startsWith('@')) continue; // scoped npm package
    if (/^\.\w+$/.test(token)) continue; // an extension named on its own (`.ts`)
    if (!upward && !topLevel.has(first)) {
      if (hasSlash && /^[a-z0-9-]+(\.[a-z0-9-]+)+$/i.test(first)) continue; // host.tld/…
      if (hasSlash && existsSync(join(root, 'node_modules', first))) continue; // npm package
    }
    const checked =
      CHECKED_EXTS.test(token) || (hasSlash && (upward || topLevel.has(first) || first === 'shared'));
    if (checked) out.push(token);
  }
  return out;
}

/** Repo-relative path `p` exists, `*` matching within one segment. */
function existsGlob(p: string, root: string): boolean {
  if (!p.includes('*')) return existsSync(join(root, p));
  const segs = p.split('/');
  const walk = (dir: string, i: number): boolean => {
    if (i === segs.length) return true;
    const seg = segs[i] ?? '';
    if (!seg.includes('*')) return existsSync(join(dir, seg)) && walk(join(dir, seg), i + 1);
    if (!existsSync(dir) || !statSync(dir).isDirectory()) return false;
    const re = new RegExp(`^${seg.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*')}$`);
    return readdirSync(dir).some((n) => re.test(n) && walk(join(dir, n), i + 1));
  };
  return walk(root, 0);
}

/** What a cited path is checked against: the repository's files and what it generates. */
export interface RepoIndex {
  root: string;
  /** Every file (repo-relative), outside node_modules and .git. */
  files: string[];
  /** Their base names. */
  basenames: Set<string>;
  /** Folders the repository writes and ignores (`.gitignore` lines ending in `/`, rooted). */
  generated: string[];
}

/** Index of the repository at `root` for {@link resolves}. */
export function repoIndex(root = REPO_ROOT): RepoIndex {
  const files = listFiles('.', root).map((f) => f.replace(/^\.\//, ''));
  const ignore = existsSync(join(root, '.gitignore')) ? readFileSync(join(root, '.gitignore'), 'utf8') : '';
  const generated = ignore
    .split('\n')
    .map((l) => l.trim().replace(/^\//, ''))
    .filter((l) => l.endsWith('/') && l.includes('/', 0) && !l.startsWith('#'))
    .map((l) => l.replace(/\/$/, ''));
  return { root, files, basenames: new Set(files.map((f) => f.split('/').pop() ?? '')), generated };
}

/**
 * Names that code comments mention as files SPACE writes at run time, not as documents to read
 * (the benchmark's saved table). Kept short on purpose; each is a file name, never a path.
 */
export const RUNTIME_FILE_NAMES: ReadonlySet<string> = new Set(['table.md']);

/**
 * Whether the path `cited` in a comment of `file` (repo-relative) names something in the
 * repository. It does when it exists relative to the file's folder or any folder above it up to
 * the root, when it is the tail of a repository path (`core/proc-stat.ts`), when it lies in a
 * folder the repository generates and ignores (`benchmarks/results`), or, for a bare
 * `.ts`/`.lua`/`.sh` name, when a file of that name exists anywhere (`*` matches within a segment).
 * A bare `.md` name must resolve by folder: the gateway's design page does not answer a bare
 * citation of that name from the agent.
 */
export function resolves(file: string, cited: string, index: RepoIndex): boolean {
  let dir = dirname(file);
  for (;;) {
    const p = normalize(join(dir, cited)).split(sep).join('/');
    if (!p.startsWith('..') && existsGlob(p, index.root)) return true;
    if (dir === '.' || dir === '') break;
    dir = dirname(dir);
  }
  if (cited.startsWith('../')) return false;
  const plain = cited.replace(/^(\.\/)+/, '');
  if (index.generated.some((g) => plain === g || plain.startsWith(`${g}/`))) return true;
  const glob = new RegExp(`(^|/)${plain.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*')}$`);
  if (plain.includes('/')) return index.files.some((f) => glob.test(f));
  if (plain.endsWith('.md')) return RUNTIME_FILE_NAMES.has(plain);
  return [...index.basenames].some((n) => glob.test(n));
}

/** Folders and files whose comments the check reads (repo-relative). */
export const CITATION_SCOPE = ['runtime', 'providers', 'stacks', 'scripts', 'benchmarks', 'test'];

/**
 * Every comment citation in the scope that does not resolve, as `file:line: path`. Files: `*.ts`
 * and `*.sh` under {@link CITATION_SCOPE}, and the root `Containerfile`.
 */
export function brokenCitations(root = REPO_ROOT): string[] {
  const index = repoIndex(root);
  const files = [
    ...index.files.filter(
      (f) => CITATION_SCOPE.some((d) => f.startsWith(`${d}/`)) && (f.endsWith('.ts') || f.endsWith('.sh')),
    ),
    ...(index.files.includes('Containerfile') ? ['Containerfile'] : []),
  ];
  const out: string[] = [];
  for (const f of files) {
    const text = readFileSync(join(root, f), 'utf8');
    // parsing is the slow part: only files with an unresolved path anywhere in them are parsed
    if (citedPaths(text, root).every((p) => resolves(f, p, index))) continue;
    for (const c of comments(f, text)) {
      for (const p of citedPaths(c.text, root)) {
        if (resolves(f, p, index)) continue;
        const at = c.text.indexOf(p);
        out.push(`${f}:${c.line + (at < 0 ? 0 : c.text.slice(0, at).split('\n').length - 1)}: ${p}`);
      }
    }
  }
  return out;
}

/** The diagram of a Markdown page: node id → label (a folder path), and `from --> to` edges. */
export interface MermaidGraph {
  nodes: Map<string, string>;
  edges: [string, string][];
}

/**
 * The first ```mermaid flowchart block of `md`: nodes declared as `id["label"]` (or `id[label]`),
 * edges as `a --> b` (ids). Throws when there is no such block or an edge names an undeclared id.
 */
export function parseMermaid(md: string): MermaidGraph {
  const block = /^```mermaid\n(flowchart|graph)\b[^\n]*\n([\s\S]*?)^```/m.exec(md);
  if (!block) throw new Error('no ```mermaid flowchart block');
  const nodes = new Map<string, string>();
  const edges: [string, string][] = [];
  for (const raw of (block[2] ?? '').split('\n')) {
    const line = raw.replace(/%%.*$/, '').trim();
    if (line === '') continue;
    const node = /^([\w-]+)\[\s*"?([^"\]]+)"?\s*\]$/.exec(line);
    const edge = /^([\w-]+)\s*-->\s*([\w-]+)$/.exec(line);
    if (node) nodes.set(node[1] ?? '', (node[2] ?? '').trim());
    else if (edge) edges.push([edge[1] ?? '', edge[2] ?? '']);
  }
  for (const [a, b] of edges) {
    for (const id of [a, b])
      if (!nodes.has(id)) throw new Error(`edge ${a} --> ${b} names undeclared node ${id}`);
  }
  return { nodes, edges };
}

/**
 * Repository-relative paths (`/`-separated) of the relative modules repo file `file` imports:
 * static imports (named or bare), `export … from`, dynamic `import()` and `require()`, as
 * TypeScript's own pre-processor finds them. Package imports are left out.
 */
export function relativeImports(file: string, root = REPO_ROOT): string[] {
  const info = ts.preProcessFile(readFileSync(join(root, file), 'utf8'), true, true);
  return info.importedFiles
    .filter((imp) => imp.fileName.startsWith('.'))
    .map((imp) =>
      relative(root, resolve(root, dirname(file), imp.fileName))
        .split(sep)
        .join('/'),
    );
}

/**
 * The import graph between `folders` (repo-relative): an edge `A --> B` when a non-test `.ts` file
 * whose deepest enclosing folder among `folders` is A imports (statically, dynamically, or by
 * `export … from`) a relative module whose deepest enclosing folder is B ≠ A. Bare package imports
 * are not edges. Files: every `.ts` under the folders, tests (`*.test.ts`), test fixtures
 * (`test-*.ts`, e.g. the agent's FakeDriver) and generated protobuf code excluded. Returns edges as `"A --> B"` strings, sorted.
 */
export function importGraph(folders: readonly string[], root = REPO_ROOT): string[] {
  const owner = (p: string): string | undefined =>
    folders.filter((f) => p === f || p.startsWith(`${f}/`)).sort((a, b) => b.length - a.length)[0];
  const edges = new Set<string>();
  const files = [...new Set(folders.flatMap((f) => listFiles(f, root)))].filter(
    (f) =>
      f.endsWith('.ts') &&
      !f.endsWith('.test.ts') &&
      !/(^|\/)test-[^/]*\.ts$/.test(f) &&
      !f.includes('/envd/gen/'),
  );
  for (const f of files) {
    const from = owner(f);
    for (const target of relativeImports(f, root)) {
      const to = owner(target);
      if (from && to && from !== to) edges.add(`${from} --> ${to}`);
    }
  }
  return [...edges].sort();
}
