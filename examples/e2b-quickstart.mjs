// Runs unchanged against E2B and against SPACE: only the environment differs.
//   E2B:   export E2B_API_KEY=e2b_…
//   SPACE: eval "$(space e2b env)"
import { Sandbox } from 'e2b';

const sbx = await Sandbox.create();
try {
  await sbx.files.write('/home/user/hello.py', 'print("hello from", __import__("platform").node())');
  const run = await sbx.commands.run('python3 /home/user/hello.py');
  console.log(run.stdout.trim());
  const names = (await sbx.files.list('/home/user')).map((e) => e.name);
  console.log(names.includes('hello.py') ? 'file listed' : 'file missing');
} finally {
  await sbx.kill();
}
