/**
 * A minimal QMP (QEMU Machine Protocol) client over a Unix socket: one connection per use, commands
 * sent one at a time, events ignored. QEMU's QMP server takes one client at a time, so callers
 * connect, run their commands and {@link Qmp.close} promptly.
 */
import { connect, type Socket } from 'node:net';

/** A QMP error reply (`{"error": {"class", "desc"}}`). */
export class QmpError extends Error {
  readonly errorClass: string;
  constructor(errorClass: string, desc: string) {
    super(`QMP ${errorClass}: ${desc}`);
    this.errorClass = errorClass;
  }
}

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
}

export class Qmp {
  readonly #socket: Socket;
  readonly #pending = new Map<number, Pending>();
  #buffer = '';
  #seq = 0;
  #closedError: Error | null = null;

  private constructor(socket: Socket) {
    this.#socket = socket;
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => this.#onData(chunk));
    socket.on('close', () => this.#fail(this.#closedError ?? new Error('QMP connection closed')));
    socket.on('error', (err) => {
      this.#closedError = err;
    });
  }

  /**
   * Connects, reads the greeting and leaves capabilities negotiation mode.
   * @param timeoutMs for the whole handshake (default 5 000).
   * @throws Error when the socket refuses, the greeting does not come in time, or QEMU errs.
   */
  static async connect(path: string, timeoutMs = 5000): Promise<Qmp> {
    const socket = connect(path);
    const qmp = await new Promise<Qmp>((resolve, reject) => {
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new Error(`no QMP greeting on ${path} within ${timeoutMs} ms`));
      }, timeoutMs);
      let text = '';
      const onData = (chunk: Buffer) => {
        text += chunk.toString('utf8');
        const nl = text.indexOf('\n');
        if (nl < 0) return;
        clearTimeout(timer);
        socket.off('data', onData);
        socket.off('error', onError);
        const rest = text.slice(nl + 1);
        try {
          if (!('QMP' in (JSON.parse(text.slice(0, nl)) as object))) throw new Error('not a QMP greeting');
        } catch (err) {
          socket.destroy();
          reject(err);
          return;
        }
        const q = new Qmp(socket);
        if (rest) q.#onData(rest);
        resolve(q);
      };
      const onError = (err: Error) => {
        clearTimeout(timer);
        reject(err);
      };
      socket.on('data', onData);
      socket.once('error', onError);
    });
    await qmp.execute('qmp_capabilities', undefined, timeoutMs);
    return qmp;
  }

  /**
   * Runs one command. @returns its `return` value.
   * @throws QmpError on an error reply; Error on timeout (default 30 000 ms) or a lost connection.
   */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, timeoutMs = 30_000): Promise<T> {
    if (this.#closedError || this.#socket.destroyed)
      return Promise.reject(this.#closedError ?? new Error('QMP connection closed'));
    const id = ++this.#seq;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error(`QMP ${command} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#pending.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v as T);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      this.#socket.write(
        `${JSON.stringify({ execute: command, ...(args ? { arguments: args } : {}), id })}\n`,
      );
    });
  }

  /** Closes the connection (pending commands fail). */
  close(): void {
    this.#socket.destroy();
  }

  #onData(chunk: string): void {
    this.#buffer += chunk;
    for (let nl = this.#buffer.indexOf('\n'); nl >= 0; nl = this.#buffer.indexOf('\n')) {
      const line = this.#buffer.slice(0, nl).trim();
      this.#buffer = this.#buffer.slice(nl + 1);
      if (!line) continue;
      let msg: { id?: number; return?: unknown; error?: { class: string; desc: string }; event?: string };
      try {
        msg = JSON.parse(line);
      } catch {
        continue;
      }
      if (msg.event || msg.id === undefined) continue;
      const p = this.#pending.get(msg.id);
      if (!p) continue;
      this.#pending.delete(msg.id);
      if (msg.error) p.reject(new QmpError(msg.error.class, msg.error.desc));
      else p.resolve(msg.return);
    }
  }

  #fail(err: Error): void {
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
  }
}

/**
 * Connects to `path`, runs `fn`, closes. @throws whatever connecting or `fn` throws.
 */
export async function withQmp<T>(path: string, fn: (q: Qmp) => Promise<T>, timeoutMs = 5000): Promise<T> {
  const q = await Qmp.connect(path, timeoutMs);
  try {
    return await fn(q);
  } finally {
    q.close();
  }
}
