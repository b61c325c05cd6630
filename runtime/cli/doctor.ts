/**
 * `space doctor`: what this node supports and which driver the agent would pick (with the same
 * `SPACE_*` settings), with a remedy for each missing piece. Exit 0 when the chosen driver has
 * everything it needs, 1 otherwise.
 */
import type { Command } from 'commander';
import { loadConfig } from '../core/config.ts';
import { isJson } from './context.ts';
import { printJson, println, table } from './output.ts';

/** Registers `space doctor`. */
export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description(
      'check what this node supports (KVM, VMMs, runsc, nftables, cgroups, IPv4 forwarding…) and which driver the agent picks',
    )
    .addHelpText(
      'after',
      `
Reads the agent's settings from the environment (SPACE_DRIVER, SPACE_KVM, SPACE_*_BINARY,
SPACE_GVISOR_PLATFORM). KVM is probed by booting a guest under it, not by looking for /dev/kvm.
Features that need host settings are listed too (CIDR egress rules need net.ipv4.ip_forward=1),
and so is the state disk's headroom (free and total bytes at SPACE_AGENT_STATE_DIR against the
floor under which the node takes no new sandboxes); they never change the exit status.
Exit status: 0 when the chosen driver has all it needs, 1 when it does not.`,
    )
    .action(async (_opts, cmd: Command) => {
      const { agentSettings } = await import('../agent/config.ts');
      const { diagnose } = await import('../agent/doctor.ts');
      const s = agentSettings;
      const config = loadConfig('agent', {
        driver: s.driver,
        kvm: s.kvm,
        gvisorPlatform: s.gvisorPlatform,
        runscBinary: s.runscBinary,
        qemuBinary: s.qemuBinary,
        firecrackerBinary: s.firecrackerBinary,
        jailerBinary: s.jailerBinary,
        cloudHypervisorBinary: s.cloudHypervisorBinary,
        stateDir: s.stateDir,
        diskReserveBytes: s.diskReserveBytes,
        diskReservePercent: s.diskReservePercent,
      });
      const report = await diagnose(config, {
        stateDir: config.stateDir,
        reserve: { bytes: config.diskReserveBytes, percent: config.diskReservePercent },
      });
      if (isJson(cmd)) printJson(report);
      else {
        println(
          table(
            ['check', 'ok', 'found', 'needed by'],
            report.checks.map((c) => [c.id, c.ok ? 'yes' : 'NO', c.detail, c.neededBy.join(',') || '-']),
          ),
        );
        println();
        println(`driver: ${report.driver.name ?? 'none'} (${report.driver.reason})`);
        const chosen = report.driver.name;
        const missing = report.checks.filter((c) => !c.ok && c.remedy && c.neededBy.length > 0);
        const blocking = missing.filter((c) => chosen !== null && c.neededBy.includes(chosen));
        const others = missing.filter((c) => !blocking.includes(c));
        if (blocking.length) {
          println();
          println(`to fix (the ${chosen} driver needs these):`);
          for (const c of blocking) println(`  ${c.id}: ${c.remedy}`);
        }
        if (others.length) {
          println();
          println('to enable other drivers:');
          for (const c of others) println(`  ${c.id}: ${c.remedy}`);
        }
        for (const c of report.checks.filter((x) => !x.ok && x.feature && x.remedy)) {
          println();
          println(`to use ${c.feature}:`);
          println(`  ${c.id}: ${c.detail}`);
          println(`  fix: ${c.remedy}`);
        }
        println();
        println(
          report.ready
            ? 'ready: the agent can run here'
            : 'not ready: the chosen driver is missing what it needs',
        );
      }
      process.exitCode = report.ready ? 0 : 1;
    });
}
