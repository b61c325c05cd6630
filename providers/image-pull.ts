/**
 * Pulling the SPACE image from a registry that wants credentials (`space:imagePullUsername` and
 * the secret `space:imagePullPassword`): which registry a repository names, and the auth file
 * podman reads. Pure.
 */

/**
 * The registry host of an image repository, as container tools read a reference: the first path
 * component when it holds a `.` or a `:` or is `localhost`, else Docker Hub (`docker.io`)
 * (distribution/reference's domain split; containers-auth.json(5) keys entries by this name).
 */
export function imageRegistry(repository: string): string {
  const first = repository.split('/')[0]!;
  return repository.includes('/') && (first.includes('.') || first.includes(':') || first === 'localhost')
    ? first
    : 'docker.io';
}

/** Credentials for the image's registry. */
export interface ImagePullCredentials {
  /** Registry user name (no `:`, which would end it inside the `auth` field). */
  readonly username: string;
  /** Its password or token (secret). */
  readonly password: string;
}

/**
 * The auth file podman reads with `--authfile` (containers-auth.json(5), the Docker config
 * format): one entry for `repository`'s registry whose `auth` is base64 of `username:password`;
 * with no credentials an empty `auths` object, so the same `--authfile` pulls anonymously.
 * @throws Error when the user name holds a `:` (the stack configuration refuses it first).
 */
export function registryAuthFile(repository: string, creds?: ImagePullCredentials): string {
  if (creds?.username.includes(':')) throw new Error('the image pull user name must not contain ":"');
  const auths = creds
    ? {
        [imageRegistry(repository)]: {
          auth: Buffer.from(`${creds.username}:${creds.password}`, 'utf8').toString('base64'),
        },
      }
    : {};
  return `${JSON.stringify({ auths }, null, 2)}\n`;
}
